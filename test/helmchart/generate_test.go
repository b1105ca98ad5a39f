package helmchart_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// updateEnv, set to 1, makes TestChartIsGenerated write the generated part of the
// chart instead of comparing it.
const updateEnv = "UNDERSTORY_UPDATE_CHART"

// generatedHeader starts every template the generator writes; a template with it
// that the generator no longer writes is stale.
const generatedHeader = "# Generated from manifests/ by test/helmchart: do not edit. Edit manifests/, then run\n" +
	"#   " + updateEnv + "=1 go test ./test/helmchart -run TestChartIsGenerated\n"

// feature is a kustomize component the chart turns on with a value.
type feature struct {
	name       string   // the template file of the objects it adds
	components []string // kustomize components, relative to manifests/
	cond       string   // the Helm condition that turns it on
	exclusive  string   // features of one group are never on together
	// total: exactly one feature of the exclusive group is always on (a values
	// schema enum), so the base without any of them is never rendered.
	total bool
	// handWritten: the objects it adds are written by hand (templates/certs.yaml)
	// and only compared, not generated.
	handWritten bool
}

// features are the chart's kustomize components. The agent's cgroup driver
// (components/systemd) is not one: it is a value in the agent's configuration.
func features() []feature {
	return []feature{
		{name: "gpu", components: []string{"components/gpu"}, cond: ".Values.gpu.enabled"},
		{name: "certs-self-signed", components: []string{"certs"}, cond: `eq .Values.certificates.mode "self-signed"`, exclusive: "certs", total: true, handWritten: true},
		{name: "certs-cert-manager", components: []string{"components/cert-manager"}, cond: `eq .Values.certificates.mode "cert-manager"`, exclusive: "certs", total: true},
		{name: "prometheusrule", components: []string{"components/prometheusrule"}, cond: `eq .Values.alerts "prometheusRule"`},
		{name: "servicemonitors", components: []string{"components/servicemonitor"}, cond: ".Values.serviceMonitors.enabled"},
		{name: "second-scheduler", components: []string{"components/second-scheduler"}, cond: ".Values.secondScheduler.enabled"},
		{name: "kueue", components: []string{"components/kueue"}, cond: ".Values.kueue.enabled"},
		{name: "from-koordinator", components: []string{"components/from-koordinator"}, cond: ".Values.koordinator.enabled"},
	}
}

// Objects of the base that the chart treats apart.
const (
	koordletConfigMap = "ConfigMap/understory-system/understory-koordlet"
	rulesConfigMap    = "ConfigMap/understory-system/understory-prometheus-rules"
	extenderDeploy    = "Deployment/understory-system/understory-scheduler-extender"
	extenderService   = "Service/understory-system/understory-scheduler-extender"
	secondScheduler   = "Deployment/understory-system/understory-scheduler"
	kueueFollower     = "Deployment/understory-system/understory-kueue-quota"
	webhookConfig     = "MutatingWebhookConfiguration//understory-admission"
	namespaceObject   = "Namespace//understory-system"
	originAnnotation  = "config.kubernetes.io/origin"
)

// baseConditions are base objects rendered only under a condition.
func baseConditions() map[string]string {
	return map[string]string{rulesConfigMap: `eq .Values.alerts "configMap"`}
}

// token kinds: how a placeholder in the marshalled YAML becomes template text.
type tokenKind int

const (
	inline   tokenKind = iota // the token is replaced by the snippet
	block                     // "key: TOKEN" becomes a block scalar filled by the snippet
	listItem                  // "- TOKEN" becomes the lines of the snippet
	mapEntry                  // "TOKEN: x" becomes the lines of the snippet, NINDENT its values' indent, KINDENT its own
)

type token struct {
	kind    tokenKind
	snippet string // for block: the expression piped to nindent
	style   string // for block: |, |- or |+
}

// generator turns kustomize's objects into chart text.
type generator struct {
	version string
	tokens  map[string]token
	files   map[string]string // chart-relative path -> content
}

var (
	tokenRE = regexp.MustCompile(`HELMTOKEN_[A-Za-z0-9_-]+`)
	// kubeSchedulerRE: the second scheduler's image, the value secondScheduler.image
	// (empty: the cluster's version).
	// hashSuffixRE: the content hash kustomize appends to a generated ConfigMap's name.
	hashSuffixRE    = regexp.MustCompile(`-[bcdfghkmt2-9]{10}$`)
	kubeSchedulerRE = regexp.MustCompile(`^registry\.k8s\.io/kube-scheduler:v[0-9.]+$`)
)

// blockStyle is the YAML block indicator that keeps s's trailing newlines.
func blockStyle(s string) string {
	switch {
	case !strings.HasSuffix(s, "\n"):
		return "|-"
	case strings.HasSuffix(s, "\n\n"):
		return "|+"
	}
	return "|"
}

// addFile records a file the chart reads with .Files.Get.
func (g *generator) addFile(p, content string) error {
	if old, ok := g.files[p]; ok && old != content {
		return fmt.Errorf("%s: two different contents (a component changes it; the chart cannot follow that)", p)
	}
	g.files[p] = content
	return nil
}

// templatize returns the chart text of one object: its YAML with the values'
// placeholders and with "{{" / "}}" of the object's own text escaped.
func (g *generator) templatize(o obj) (string, error) {
	o, err := deepCopy(o)
	if err != nil {
		return "", err
	}
	k := key(o)
	stripOrigin(o)
	imageRE := regexp.MustCompile(`^understory/([a-z0-9-]+):` + regexp.QuoteMeta(g.version) + `$`)
	walkStrings(o, func(s string) (string, bool) {
		m := imageRE.FindStringSubmatch(s)
		if kubeSchedulerRE.MatchString(s) {
			g.tokens["HELMTOKEN_KUBE_SCHEDULER_IMAGE"] = token{kind: inline, snippet: `{{ include "understory.kubeSchedulerImage" . | quote }}`}
			return "HELMTOKEN_KUBE_SCHEDULER_IMAGE", true
		}
		if m == nil {
			return s, false
		}
		id := "HELMTOKEN_IMAGE_" + m[1]
		g.tokens[id] = token{kind: inline, snippet: fmt.Sprintf(`"{{ .Values.image.repository }}/%s:{{ .Values.image.tag }}"`, m[1])}
		return id, true
	})
	switch {
	case o["kind"] == "ConfigMap":
		data, _ := o["data"].(map[string]any)
		name := strings.TrimPrefix(k, "ConfigMap/"+namespace+"/")
		for dk, dv := range data {
			s, _ := dv.(string)
			if k == koordletConfigMap && dk == "config.yaml" {
				if err := g.addFile("files/koordlet/config.yaml", s); err != nil {
					return "", err
				}
				data[dk] = "HELMTOKEN_KOORDLET_CONFIG"
				g.tokens["HELMTOKEN_KOORDLET_CONFIG"] = token{kind: block, style: "|", snippet: `include "understory.koordletConfig" .`}
				continue
			}
			if strings.Count(s, "\n") < 10 || strings.HasPrefix(s, " ") {
				continue
			}
			p := path.Join("files", hashSuffixRE.ReplaceAllString(name, ""), dk)
			if err := g.addFile(p, s); err != nil {
				return "", err
			}
			id := "HELMTOKEN_FILE_" + strings.NewReplacer("/", "_", ".", "_").Replace(name+"/"+dk)
			data[dk] = id
			g.tokens[id] = token{kind: block, style: blockStyle(s), snippet: fmt.Sprintf(".Files.Get %q", p)}
		}
	case k == extenderDeploy:
		if err := g.extraArgs(o, "extender", "HELMTOKEN_EXTENDER_EXTRA_ARGS", ".Values.schedulerExtender.extraArgs"); err != nil {
			return "", err
		}
	case k == kueueFollower:
		if err := g.extraArgs(o, "follower", "HELMTOKEN_KUEUE_QUOTA_EXTRA_ARGS", ".Values.kueue.quotaFollower.extraArgs"); err != nil {
			return "", err
		}
	case k == extenderService:
		// A fixed ClusterIP (schedulerExtender.clusterIP), for clusters without DNS whose
		// second scheduler must know the address before the install.
		spec, _ := o["spec"].(map[string]any)
		if spec == nil {
			return "", fmt.Errorf("%s: no spec for schedulerExtender.clusterIP", k)
		}
		spec["HELMTOKEN_EXTENDER_CLUSTER_IP"] = ""
		g.tokens["HELMTOKEN_EXTENDER_CLUSTER_IP"] = token{kind: mapEntry,
			snippet: "{{- with .Values.schedulerExtender.clusterIP }}\nclusterIP: {{ . | quote }}\n{{- end }}"}
	case k == secondScheduler:
		// secondScheduler.hostAliases: the extender's Service name resolved without DNS.
		spec, _ := o["spec"].(map[string]any)
		tmpl, _ := spec["template"].(map[string]any)
		pspec, _ := tmpl["spec"].(map[string]any)
		if pspec == nil {
			return "", fmt.Errorf("%s: no pod spec for secondScheduler.hostAliases", k)
		}
		pspec["HELMTOKEN_SECOND_SCHEDULER_HOST_ALIASES"] = ""
		g.tokens["HELMTOKEN_SECOND_SCHEDULER_HOST_ALIASES"] = token{kind: mapEntry,
			snippet: "{{- with .Values.secondScheduler.hostAliases }}\nhostAliases:\n  {{- toYaml . | nindent NINDENT }}\n{{- end }}"}
	case k == webhookConfig:
		hooks, _ := o["webhooks"].([]any)
		for _, h := range hooks {
			cc, _ := h.(map[string]any)["clientConfig"].(map[string]any)
			if _, ok := cc["caBundle"]; ok {
				cc["caBundle"] = "HELMTOKEN_CABUNDLE"
				g.tokens["HELMTOKEN_CABUNDLE"] = token{kind: inline, snippet: `{{ include "understory.caBundle" . }}`}
			}
		}
	}
	if k == admissionDeploy || k == admissionPolicy {
		if err := g.admissionPort(o); err != nil {
			return "", err
		}
	}
	if w, ok := workloads()[k]; ok {
		if err := g.podValues(o, w); err != nil {
			return "", err
		}
	}
	switch o["kind"] {
	case "ServiceMonitor":
		if err := g.monitorValues(o, "serviceMonitors"); err != nil {
			return "", err
		}
	case "PrometheusRule":
		if err := g.monitorValues(o, "prometheusRule"); err != nil {
			return "", err
		}
	}
	out, err := yaml.Marshal(o)
	if err != nil {
		return "", fmt.Errorf("%s: %w", k, err)
	}
	text := escapeTemplate(string(out))
	var b strings.Builder
	for _, line := range strings.SplitAfter(text, "\n") {
		id := tokenRE.FindString(line)
		if id == "" {
			b.WriteString(line)
			continue
		}
		tok, ok := g.tokens[id]
		if !ok {
			return "", fmt.Errorf("%s: unknown placeholder %s", k, id)
		}
		indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
		switch tok.kind {
		case inline:
			b.WriteString(strings.Replace(line, id, tok.snippet, 1))
		case block:
			head, _, _ := strings.Cut(line, id)
			fmt.Fprintf(&b, "%s%s\n%s  {{- %s | nindent %d }}\n", head, tok.style, indent, tok.snippet, len(indent)+2)
		case listItem:
			for _, l := range strings.Split(tok.snippet, "\n") {
				b.WriteString(indent + l + "\n")
			}
		case mapEntry:
			sn := strings.ReplaceAll(tok.snippet, "NINDENT", strconv.Itoa(len(indent)+2))
			sn = strings.ReplaceAll(sn, "KINDENT", strconv.Itoa(len(indent)))
			for _, l := range strings.Split(sn, "\n") {
				b.WriteString(indent + l + "\n")
			}
		}
	}
	return b.String(), nil
}

// extraArgs appends the list value to the args of Deployment o's container: a
// placeholder id after its own arguments.
func (g *generator) extraArgs(o obj, container, id, value string) error {
	spec, _ := o["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pspec, _ := tmpl["spec"].(map[string]any)
	containers, _ := pspec["containers"].([]any)
	found := false
	for _, c := range containers {
		cm, _ := c.(map[string]any)
		if cm["name"] != container {
			continue
		}
		args, _ := cm["args"].([]any)
		cm["args"] = append(args, id)
		found = true
	}
	if !found {
		return fmt.Errorf("%s: no container %s for %s", key(o), container, strings.TrimPrefix(value, ".Values."))
	}
	g.tokens[id] = token{kind: listItem, snippet: "{{- range " + value + " }}\n- {{ . | quote }}\n{{- end }}"}
	return nil
}

// escapeTemplate makes literal text survive Helm's template engine.
func escapeTemplate(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case strings.HasPrefix(s[i:], "{{"):
			b.WriteString(`{{ "{{" }}`)
			i++
		case strings.HasPrefix(s[i:], "}}"):
			b.WriteString(`{{ "}}" }}`)
			i++
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func deepCopy(o obj) (obj, error) {
	data, err := yaml.Marshal(o)
	if err != nil {
		return nil, err
	}
	out := obj{}
	return out, yaml.Unmarshal(data, &out)
}

// walkStrings replaces every string value of v (not map keys) by f's result.
func walkStrings(v any, f func(string) (string, bool)) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if s, ok := e.(string); ok {
				if n, ok := f(s); ok {
					t[k] = n
				}
				continue
			}
			walkStrings(e, f)
		}
	case []any:
		for i, e := range t {
			if s, ok := e.(string); ok {
				if n, ok := f(s); ok {
					t[i] = n
				}
				continue
			}
			walkStrings(e, f)
		}
	}
}

// stripOrigin removes kustomize's origin annotation (and annotations left empty).
func stripOrigin(o obj) {
	md, _ := o["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		return
	}
	delete(ann, originAnnotation)
	if len(ann) == 0 {
		delete(md, "annotations")
	}
}

// group is the template file a base object goes to: the directory of manifests/ it
// comes from (for manifests/base itself, the file).
func group(o obj) (string, error) {
	md, _ := o["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	s, _ := ann[originAnnotation].(string)
	var origin struct {
		Path         string `json:"path"`
		ConfiguredIn string `json:"configuredIn"`
	}
	if err := yaml.Unmarshal([]byte(s), &origin); err != nil {
		return "", fmt.Errorf("%s: origin %q: %w", key(o), s, err)
	}
	p := origin.Path
	if p == "" {
		p = origin.ConfiguredIn
	}
	parts := strings.Split(path.Clean(p), "/")
	if len(parts) < 3 || parts[0] != ".." {
		return "", fmt.Errorf("%s: origin %q is not a file of manifests/", key(o), s)
	}
	if parts[1] == "base" {
		return strings.TrimSuffix(parts[2], ".yaml"), nil
	}
	return parts[1], nil
}

// generate returns every generated file of the chart (chart-relative paths).
func generate(ctx context.Context, m manifests, version string) (map[string]string, error) {
	g := &generator{version: version, tokens: map[string]token{}, files: map[string]string{}}
	base, err := m.build(ctx, "gen-base", []string{"base"}, nil, true)
	if err != nil {
		return nil, err
	}
	baseText := map[string]string{}
	baseKeys := make([]string, 0, len(base))
	groups := map[string]string{}
	for _, o := range base {
		k := key(o)
		if groups[k], err = group(o); err != nil {
			return nil, err
		}
		if baseText[k], err = g.templatize(o); err != nil {
			return nil, err
		}
		baseKeys = append(baseKeys, k)
	}

	// changedBy[k] lists the features that change base object k.
	changedBy := map[string][]feature{}
	added := map[string][]string{} // feature name -> texts of the objects it adds
	for _, f := range features() {
		objs, err := m.build(ctx, "gen-"+f.name, []string{"base"}, f.components, false)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, o := range objs {
			k := key(o)
			seen[k] = true
			text, err := g.templatize(o)
			if err != nil {
				return nil, err
			}
			bt, inBase := baseText[k]
			switch {
			case !inBase && f.handWritten:
			case !inBase:
				added[f.name] = append(added[f.name], text)
			case text != bt:
				changedBy[k] = append(changedBy[k], f)
			}
		}
		for _, k := range baseKeys {
			if !seen[k] {
				return nil, fmt.Errorf("feature %s removes %s: the generator cannot express that", f.name, k)
			}
		}
	}
	// An object more than one feature changes: every combination of them is built
	// (one feature of each exclusive group at most), most features first.
	builds := map[string]map[string]string{} // combination name -> key -> text
	buildCombo := func(combo []feature) (map[string]string, error) {
		var names, comps []string
		for _, f := range combo {
			names = append(names, f.name)
			comps = append(comps, f.components...)
		}
		name := strings.Join(names, "+")
		if b, ok := builds[name]; ok {
			return b, nil
		}
		objs, err := m.build(ctx, "gen-"+name, []string{"base"}, comps, false)
		if err != nil {
			return nil, err
		}
		b := map[string]string{}
		for _, o := range objs {
			if b[key(o)], err = g.templatize(o); err != nil {
				return nil, err
			}
		}
		builds[name] = b
		return b, nil
	}
	type variant struct {
		cond, text string
	}
	variants := map[string][]variant{}
	totalChange := map[string]bool{} // a feature of a total group changes the object
	for _, k := range baseKeys {
		fs := changedBy[k]
		if len(fs) == 0 {
			continue
		}
		for _, f := range fs {
			totalChange[k] = totalChange[k] || f.total
		}
		for _, combo := range combinations(fs) {
			b, err := buildCombo(combo)
			if err != nil {
				return nil, err
			}
			conds := make([]string, len(combo))
			for i, f := range combo {
				conds[i] = f.cond
			}
			cond := conds[0]
			if len(conds) > 1 {
				cond = "and (" + strings.Join(conds, ") (") + ")"
			}
			variants[k] = append(variants[k], variant{cond, b[k]})
		}
	}

	files := map[string]string{}
	for p, c := range g.files {
		files[p] = c
	}
	conds := baseConditions()
	byGroup := map[string]*strings.Builder{}
	var groupOrder []string
	for _, k := range baseKeys {
		text := baseText[k]
		switch {
		case k == namespaceObject:
			continue // helm install --create-namespace makes it (expectedDifferences, chart_test.go)
		case strings.HasPrefix(k, "CustomResourceDefinition/"):
			name := k[strings.LastIndex(k, "/")+1:]
			files["crds/"+name+".yaml"] = unescapeForCRD(text)
			continue
		}
		b := byGroup[groups[k]]
		if b == nil {
			b = &strings.Builder{}
			b.WriteString(generatedHeader)
			byGroup[groups[k]] = b
			groupOrder = append(groupOrder, groups[k])
		}
		vs := variants[k]
		b.WriteString("---\n")
		if c, ok := conds[k]; ok {
			if len(vs) > 0 {
				return nil, fmt.Errorf("%s has a condition and is changed by a feature", k)
			}
			fmt.Fprintf(b, "{{- if %s }}\n%s{{- end }}\n", c, text)
			continue
		}
		if len(vs) == 0 {
			b.WriteString(text)
			continue
		}
		// The base is rendered unless a total group changes the object: then the
		// last variant is the else.
		last := text
		if totalChange[k] {
			last, vs = vs[len(vs)-1].text, vs[:len(vs)-1]
		}
		for i, v := range vs {
			kw := "if"
			if i > 0 {
				kw = "else if"
			}
			fmt.Fprintf(b, "{{- %s %s }}\n%s", kw, v.cond, v.text)
		}
		fmt.Fprintf(b, "{{- else }}\n%s{{- end }}\n", last)
	}
	for _, grp := range groupOrder {
		files["templates/"+grp+".yaml"] = byGroup[grp].String()
	}
	for _, f := range features() {
		texts := added[f.name]
		if len(texts) == 0 {
			continue
		}
		var b strings.Builder
		b.WriteString(generatedHeader)
		fmt.Fprintf(&b, "{{- if %s }}\n", f.cond)
		for _, t := range texts {
			b.WriteString("---\n" + t)
		}
		b.WriteString("{{- end }}\n")
		files["templates/"+f.name+".yaml"] = b.String()
	}
	return files, nil
}

// combinations returns every non-empty set of fs with at most one feature of each
// exclusive group, the largest first (so that an if/else chain tests them in order).
func combinations(fs []feature) [][]feature {
	var dims [][]feature // each dimension: its options (nil = none of them)
	groupDim := map[string]int{}
	for _, f := range fs {
		if f.exclusive != "" {
			if i, ok := groupDim[f.exclusive]; ok {
				dims[i] = append(dims[i], f)
				continue
			}
			groupDim[f.exclusive] = len(dims)
		}
		dims = append(dims, []feature{f})
	}
	out := [][]feature{nil}
	for _, d := range dims {
		var next [][]feature
		for _, c := range out {
			next = append(next, c)
			for _, f := range d {
				next = append(next, append(append([]feature(nil), c...), f))
			}
		}
		out = next
	}
	out = out[1:] // the empty set: the base
	// Drop the sets without a feature of a total group (never rendered).
	kept := out[:0]
	for _, c := range out {
		ok := true
		for _, d := range dims {
			if !d[0].total {
				continue
			}
			has := false
			for _, f := range c {
				has = has || f.exclusive == d[0].exclusive
			}
			ok = ok && has
		}
		if ok {
			kept = append(kept, c)
		}
	}
	out = kept
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeForCRD: crds/ is not templated, so the CRD is written as kustomize gave it.
func unescapeForCRD(text string) string {
	text = strings.ReplaceAll(text, `{{ "{{" }}`, "{{")
	return generatedHeader + strings.ReplaceAll(text, `{{ "}}" }}`, "}}")
}

// generatedOnDisk lists the chart's files the generator owns: files/, crds/ and the
// templates that start with generatedHeader.
func generatedOnDisk(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		top := strings.SplitN(rel, "/", 2)[0]
		if top == "files" || top == "crds" || (top == "templates" && bytes.HasPrefix(data, []byte(generatedHeader))) {
			out[rel] = string(data)
		}
		return nil
	})
	return out, err
}

// The chart's objects are kustomize's: every template but certs.yaml, and the CRD
// and data files, are written by generate from `kubectl kustomize` of manifests/, so
// the chart cannot drift from the kustomize install. This test fails when the
// committed chart is not what generate writes now; with UNDERSTORY_UPDATE_CHART=1 it
// writes it.
func TestChartIsGenerated(t *testing.T) {
	t.Parallel()
	m := newManifests(t)
	version := readVersion(t)
	want, err := generate(context.Background(), m, version)
	if err != nil {
		t.Fatal(err)
	}
	have, err := generatedOnDisk(chartDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if os.Getenv(updateEnv) == "1" {
		for p := range have {
			if _, ok := want[p]; !ok {
				if err := os.Remove(filepath.Join(chartDir, p)); err != nil {
					t.Fatal(err)
				}
				_ = os.Remove(filepath.Dir(filepath.Join(chartDir, p))) // only when empty
			}
		}
		for p, c := range want {
			full := filepath.Join(chartDir, p)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("wrote %d generated files under %s", len(want), chartDir)
		return
	}
	for _, p := range unionKeys(want, have) {
		w, inWant := want[p]
		h, inHave := have[p]
		switch {
		case !inHave:
			t.Errorf("charts/understory/%s is missing", p)
		case !inWant:
			t.Errorf("charts/understory/%s is stale: the generator no longer writes it", p)
		case !reflect.DeepEqual(w, h):
			t.Errorf("charts/understory/%s differs from what the generator writes: %s", p, firstDiff(h, w))
		}
	}
	if t.Failed() {
		t.Logf("manifests/ changed: run %s=1 go test ./test/helmchart -run TestChartIsGenerated", updateEnv)
	}
}

// firstDiff names the first line where have and want differ.
func firstDiff(have, want string) string {
	hl, wl := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(hl) || i < len(wl); i++ {
		var h, w string
		if i < len(hl) {
			h = hl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if h != w {
			return fmt.Sprintf("line %d: committed %q, generated %q", i+1, h, w)
		}
	}
	return "(equal lines; different line endings)"
}

// readVersion returns the repository's VERSION.
func readVersion(t *testing.T) string {
	t.Helper()
	v, err := os.ReadFile(filepath.Join(repoRoot, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

// unionKeys is every key of a and b, sorted: what a comparison of the two walks.
func unionKeys[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
