package helmchart_test

import (
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// workload is a Deployment or DaemonSet of the install whose placement, priority
// and resources are chart values under one key.
type workload struct {
	values    string // the values key, e.g. "koordlet" or "kueue.quotaFollower"
	container string // the container whose resources the value sets
}

// workloads are the install's pods that production values place and size.
func workloads() map[string]workload {
	return map[string]workload{
		"DaemonSet/" + namespace + "/understory-koordlet":     {"koordlet", "koordlet"},
		"DaemonSet/" + namespace + "/understory-koordlet-gpu": {"gpu", "koordlet"},
		extenderDeploy: {"schedulerExtender", "extender"},
		"Deployment/" + namespace + "/understory-admission": {"admission", "admission"},
		secondScheduler: {"secondScheduler", "kube-scheduler"},
		kueueFollower:   {"kueue.quotaFollower", "follower"},
	}
}

// podFields are the pod spec fields a value replaces whole; an empty value keeps
// the manifests' own (which README.md lists).
var podFields = []string{"nodeSelector", "tolerations", "affinity", "priorityClassName"}

// newToken registers a token and returns its placeholder. A map entry's sorts
// last among its map's keys (marshalled in byte order), so that it is never the
// first key of a list item, on the item's "- " line.
func (g *generator) newToken(t token) string {
	id := fmt.Sprintf("HELMTOKEN_V%d", len(g.tokens))
	g.tokens[id] = t
	if t.kind == mapEntry {
		return "zz_" + id
	}
	return id
}

// override makes field f of map m the value at path (".Values.x.f") when it is
// set, and m's own value (if any) otherwise.
func (g *generator) override(m map[string]any, f, path string) error {
	lit, has := m[f]
	delete(m, f)
	sn := "{{- if " + path + " }}\n" + f + ":\n  {{- toYaml " + path + " | nindent NINDENT }}\n"
	if has {
		b, err := yaml.Marshal(map[string]any{f: lit})
		if err != nil {
			return err
		}
		sn += "{{- else }}\n" + strings.TrimSuffix(escapeTemplate(string(b)), "\n") + "\n"
	}
	m[g.newToken(token{kind: mapEntry, snippet: sn + "{{- end }}"})] = ""
	return nil
}

// podValues makes workload o's placement, priority, resources, pull secrets and (a
// DaemonSet's) rollout pace chart values.
func (g *generator) podValues(o obj, w workload) error {
	k := key(o)
	spec, _ := o["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pspec, _ := tmpl["spec"].(map[string]any)
	if pspec == nil {
		return fmt.Errorf("%s: no pod spec", k)
	}
	v := ".Values." + w.values
	for _, f := range podFields {
		if err := g.override(pspec, f, v+"."+f); err != nil {
			return err
		}
	}
	if _, ok := pspec["imagePullSecrets"]; ok {
		return fmt.Errorf("%s: the manifests set imagePullSecrets; the chart's value would be a second key", k)
	}
	pspec[g.newToken(token{kind: mapEntry,
		snippet: "{{- with .Values.imagePullSecrets }}\nimagePullSecrets:\n  {{- toYaml . | nindent NINDENT }}\n{{- end }}"})] = ""
	containers, _ := pspec["containers"].([]any)
	found := false
	for _, c := range containers {
		cm, _ := c.(map[string]any)
		if cm["name"] != w.container {
			continue
		}
		found = true
		if err := g.override(cm, "resources", v+".resources"); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("%s: no container %s for %s.resources", k, w.container, w.values)
	}
	if o["kind"] != "DaemonSet" {
		return nil
	}
	// Both agent DaemonSets roll out at koordlet.maxUnavailable.
	us, _ := spec["updateStrategy"].(map[string]any)
	ru, _ := us["rollingUpdate"].(map[string]any)
	if _, ok := ru["maxUnavailable"]; !ok {
		return fmt.Errorf("%s: no updateStrategy.rollingUpdate.maxUnavailable for koordlet.maxUnavailable", k)
	}
	ru["maxUnavailable"] = g.newToken(token{kind: inline, snippet: "{{ toYaml .Values.koordlet.maxUnavailable }}"})
	return nil
}

// monitorValues adds the labels and annotations of value key (serviceMonitors or
// prometheusRule) to a monitoring object's metadata: kube-prometheus-stack selects
// rules and monitors by a label (release: <its release>).
func (g *generator) monitorValues(o obj, valueKey string) error {
	md, _ := o["metadata"].(map[string]any)
	if md == nil {
		return fmt.Errorf("%s: no metadata", key(o))
	}
	labels, _ := md["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
		md["labels"] = labels
	}
	labels[g.newToken(token{kind: mapEntry,
		snippet: "{{- with .Values." + valueKey + ".labels }}\n{{- toYaml . | nindent KINDENT }}\n{{- end }}"})] = ""
	if _, ok := md["annotations"]; ok {
		return fmt.Errorf("%s: the manifests annotate it; the chart's %s.annotations would be a second key", key(o), valueKey)
	}
	md[g.newToken(token{kind: mapEntry,
		snippet: "{{- with .Values." + valueKey + ".annotations }}\nannotations:\n  {{- toYaml . | nindent NINDENT }}\n{{- end }}"})] = ""
	return nil
}

// Objects that carry the webhook's port (admission.port).
const (
	admissionDeploy = "Deployment/" + namespace + "/understory-admission"
	admissionPolicy = "NetworkPolicy/" + namespace + "/understory-admission"
)

// admissionPort makes the port the webhook's pod listens on, and its NetworkPolicy
// admits, the value admission.port. The manifests' own must be there to replace.
func (g *generator) admissionPort(o obj) error {
	k := key(o)
	port := g.newToken(token{kind: inline, snippet: "{{ .Values.admission.port }}"})
	n := 0
	switch k {
	case admissionDeploy:
		for _, c := range podSpec(o)["containers"].([]any) {
			cm := c.(map[string]any)
			args, _ := cm["args"].([]any)
			for i, a := range args {
				if s, _ := a.(string); strings.HasPrefix(s, "-listen=:") {
					args[i] = g.newToken(token{kind: inline, snippet: `"-listen=:{{ .Values.admission.port }}"`})
					n++
				}
			}
			ports, _ := cm["ports"].([]any)
			for _, p := range ports {
				if pm := p.(map[string]any); pm["name"] == "https" {
					pm["containerPort"] = port
					n++
				}
			}
		}
		if n != 2 {
			return fmt.Errorf("%s: %d of -listen and the https containerPort found for admission.port, want both", k, n)
		}
	case admissionPolicy:
		spec, _ := o["spec"].(map[string]any)
		rules, _ := spec["ingress"].([]any)
		for _, r := range rules {
			ports, _ := r.(map[string]any)["ports"].([]any)
			for _, p := range ports {
				p.(map[string]any)["port"] = port
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("%s: %d ports for admission.port, want 1", k, n)
		}
	}
	return nil
}
