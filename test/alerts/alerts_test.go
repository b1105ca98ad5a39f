package alerts

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/metrics"
)

// Paths relative to the module root.
const (
	ruleFilePath       = "manifests/monitoring/understory-alerts.yaml"
	prometheusRulePath = "manifests/components/prometheusrule/prometheusrule.yaml"
	scrapeConfigPath   = "manifests/monitoring/prometheus-scrape.yaml"
	unitTestsPath      = "test/alerts/testdata/understory-alerts_test.yaml"
	// kubeSchedulerMetricsPath lists kube-scheduler's metric families and their labels
	// (the second scheduler's alerts read them).
	kubeSchedulerMetricsPath = "test/alerts/testdata/kube-scheduler-v1.37.2-metrics.txt"
	installScript            = "scripts/prometheus.sh"
	// ruleFileName is the name the unit tests' rule_files give the rules under test.
	ruleFileName = "understory-alerts.yaml"
)

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// unitTests is the part of a promtool unit test file the tests read.
type unitTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// moduleRoot is the directory of go.mod, two levels above this package.
func moduleRoot(tb testing.TB) string {
	tb.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		tb.Fatalf("module root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		tb.Fatalf("module root %s: %v", root, err)
	}
	return root
}

// readYAML reads the file at rel (from the module root) into v.
func readYAML(tb testing.TB, rel string, v any) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(tb), rel))
	if err != nil {
		tb.Fatalf("reading %s: %v", rel, err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		tb.Fatalf("parsing %s: %v", rel, err)
	}
	return b
}

// ruleSource is one form of the rules under test, as a rule file's YAML.
type ruleSource struct {
	name  string
	rules []byte
}

// ruleSources returns the rules to test: the shipped rule file as it is, and the
// PrometheusRule's spec.groups.
func ruleSources(tb testing.TB) []ruleSource {
	tb.Helper()
	var plain ruleFile
	file := readYAML(tb, ruleFilePath, &plain)
	var pr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Groups any `json:"groups"`
		} `json:"spec"`
	}
	readYAML(tb, prometheusRulePath, &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		tb.Fatalf("%s is %s %s, want monitoring.coreos.com/v1 PrometheusRule", prometheusRulePath, pr.APIVersion, pr.Kind)
	}
	fromCR, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		tb.Fatalf("writing the PrometheusRule's groups as a rule file: %v", err)
	}
	return []ruleSource{{name: "rule file", rules: file}, {name: "PrometheusRule", rules: fromCR}}
}

// TestPrometheusRuleEqualsRuleFile: the Operator's PrometheusRule carries exactly the
// rule file's groups, so the two installs alert alike.
func TestPrometheusRuleEqualsRuleFile(t *testing.T) {
	t.Parallel()
	var plain map[string]any
	readYAML(t, ruleFilePath, &plain)
	var pr map[string]any
	readYAML(t, prometheusRulePath, &pr)
	spec, _ := pr["spec"].(map[string]any)
	if len(plain) != 1 || plain["groups"] == nil {
		t.Fatalf("%s: want only groups at the top, have %v", ruleFilePath, slices.Sorted(maps.Keys(plain)))
	}
	if len(spec) != 1 || spec["groups"] == nil {
		t.Fatalf("%s: want only groups in spec, have %v", prometheusRulePath, slices.Sorted(maps.Keys(spec)))
	}
	if !reflect.DeepEqual(plain["groups"], spec["groups"]) {
		want, _ := yaml.Marshal(plain["groups"])
		got, _ := yaml.Marshal(spec["groups"])
		t.Errorf("%s spec.groups differ from %s's groups (copy the rule file's groups into it, indented):\n"+
			"--- rule file\n%s\n--- PrometheusRule\n%s", prometheusRulePath, ruleFilePath, want, got)
	}
}

// TestPromtool runs `promtool check rules` and `promtool test rules` on each source.
func TestPromtool(t *testing.T) {
	t.Parallel()
	tool := findPromtool(t)
	root := moduleRoot(t)
	unit, err := os.ReadFile(filepath.Join(root, unitTestsPath))
	if err != nil {
		t.Fatalf("reading %s: %v", unitTestsPath, err)
	}
	for _, src := range ruleSources(t) {
		t.Run(src.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for file, b := range map[string][]byte{ruleFileName: src.rules, filepath.Base(unitTestsPath): unit} {
				if err := os.WriteFile(filepath.Join(dir, file), b, 0o600); err != nil {
					t.Fatalf("writing %s: %v", file, err)
				}
			}
			for _, args := range [][]string{
				{"check", "rules", ruleFileName},
				{"test", "rules", filepath.Base(unitTestsPath)},
			} {
				if out, err := runIn(dir, tool, args...); err != nil {
					t.Errorf("%v", err)
				} else {
					t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
				}
			}
		})
	}
}

// runIn runs bin with args in dir and returns its combined output.
func runIn(dir, bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// findPromtool returns a promtool binary: $UNDERSTORY_PROMTOOL, promtool in PATH, or
// the one beside the Prometheus server scripts/prometheus.sh prints (it installs
// Debian's prometheus package, which ships both). Without one the test is skipped, or
// fails under CI=true.
func findPromtool(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("UNDERSTORY_PROMTOOL"); p != "" {
		if err := executable(p); err != nil {
			tb.Fatalf("UNDERSTORY_PROMTOOL: %v", err)
		}
		return p
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	p, err := promtoolFromScript(moduleRoot(tb))
	if err != nil {
		testenv.SkipOrFailInCI(tb, "promtool (Debian package prometheus) not available: %v", err)
	}
	return p
}

// promtoolFromScript runs scripts/prometheus.sh and returns the promtool beside the
// server it prints.
func promtoolFromScript(root string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, installScript))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w\n%s", installScript, err, strings.TrimSpace(stderr.String()))
	}
	server := strings.TrimSpace(stdout.String())
	if server == "" {
		return "", fmt.Errorf("%s printed no path; stderr:\n%s", installScript, stderr.String())
	}
	p := filepath.Join(filepath.Dir(server), "promtool")
	if err := executable(p); err != nil {
		if q, lerr := exec.LookPath("promtool"); lerr == nil {
			return q, nil
		}
		return "", fmt.Errorf("no promtool beside %s: %w", server, err)
	}
	return p, nil
}

var errNotExecutable = errors.New("not an executable file")

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("promtool: %w", err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s: %w", p, errNotExecutable)
	}
	return nil
}

// TestEveryAlertFiresAndStaysQuiet: the unit tests hold, for every alert, an
// evaluation that expects it to fire and one that expects no alert.
func TestEveryAlertFiresAndStaysQuiet(t *testing.T) {
	t.Parallel()
	var rules ruleFile
	readYAML(t, ruleFilePath, &rules)
	var unit unitTests
	readYAML(t, unitTestsPath, &unit)
	if !slices.Equal(unit.RuleFiles, []string{ruleFileName}) {
		t.Errorf("%s rule_files = %v, want [%s]", unitTestsPath, unit.RuleFiles, ruleFileName)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range unit.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if fires[r.Alert] == 0 {
				t.Errorf("%s: no unit test in which %s fires", unitTestsPath, r.Alert)
			}
			if quiet[r.Alert] == 0 {
				t.Errorf("%s: no unit test in which %s stays quiet", unitTestsPath, r.Alert)
			}
		}
	}
	for name := range fires {
		if !slices.Contains(alerts, name) {
			t.Errorf("%s tests %s, which %s does not define", unitTestsPath, name, ruleFilePath)
		}
	}
	if len(alerts) == 0 {
		t.Fatalf("%s defines no alerts", ruleFilePath)
	}
}

var (
	metricRE = regexp.MustCompile(`\b(understory_[a-zA-Z0-9_]+|up)\b`)
	jobRE    = regexp.MustCompile(`\bjob\s*=~?\s*"([^"]*)"`)
	fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)
	// kueueMetricRE finds a metric's name in kueuequota/metrics.go.
	kueueMetricRE = regexp.MustCompile(`Name:\s+"(understory_kueue_quota_[a-z_]+)"`)
	// kubeSchedulerMetricRE finds kube-scheduler's metrics in an expression, with the
	// selector that follows one (group 2).
	kubeSchedulerMetricRE = regexp.MustCompile(`\b(scheduler_[a-z_]+|leader_election_[a-z_]+)\b(\{[^}]*\})?`)
	matcherRE             = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// targetLabels are the labels a scrape adds to every series: the shipped jobs' and,
// under the Prometheus Operator, the ServiceMonitors'.
var targetLabels = []string{"job", "instance", "pod", "namespace", "service", "endpoint", "container"}

// kubeSchedulerMetrics reads kubeSchedulerMetricsPath: each family's label names by
// its name (a histogram's name without _bucket, _sum, _count).
func kubeSchedulerMetrics(tb testing.TB) map[string][]string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(tb), kubeSchedulerMetricsPath))
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string][]string{}
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 3 {
			tb.Fatalf("%s:%d: %q, want: name type [label,label...]", kubeSchedulerMetricsPath, i+1, line)
		}
		out[f[0]] = nil
		if len(f) == 3 {
			out[f[0]] = strings.Split(f[2], ",")
		}
	}
	if len(out) < 20 {
		tb.Fatalf("%s lists %d metric families", kubeSchedulerMetricsPath, len(out))
	}
	return out
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

// definedMetrics returns the names of every metric the metrics package defines.
func definedMetrics(tb testing.TB) map[string]bool {
	tb.Helper()
	rec := &recorder{}
	for name, f := range map[string]func() error{
		"agent":        func() error { _, err := metrics.NewAgent(rec); return err },
		"escalation":   func() error { _, err := metrics.NewEscalation(rec); return err },
		"gpu":          func() error { _, err := metrics.NewGPU(rec); return err },
		"extender":     func() error { _, err := metrics.NewExtender(rec, nil); return err },
		"configreload": func() error { _, err := metrics.NewConfigReload(rec); return err },
		"leader":       func() error { _, err := metrics.NewLeader(rec); return err },
		"unmanaged":    func() error { return metrics.RegisterUnmanagedGPUs(rec, 0) },
		"certexpiry":   func() error { return metrics.RegisterCertExpiry(rec, "x", time.Now) },
	} {
		if err := f(); err != nil {
			tb.Fatalf("creating the %s metrics: %v", name, err)
		}
	}
	names := map[string]bool{}
	// The Kueue quota follower's metrics live in its own package, unexported.
	src, err := os.ReadFile("../../kueuequota/metrics.go")
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range kueueMetricRE.FindAllStringSubmatch(string(src), -1) {
		names[m[1]] = true
	}
	for _, c := range rec.cs {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	if len(names) < 20 {
		tb.Fatalf("found %d metric names in package metrics: has Desc.String's format changed?", len(names))
	}
	return names
}

// TestRulesNameRealMetricsAndJobs: an expression may only name metrics Understory
// exports (a histogram's _bucket, _sum, _count) or Prometheus' up, kube-scheduler's
// metrics as v1.37.2 serves them (selected only by labels their series carry), and
// only the scrape jobs that prometheus-scrape.yaml defines (the ServiceMonitors' jobs,
// the Services' names, are the same).
func TestRulesNameRealMetricsAndJobs(t *testing.T) {
	t.Parallel()
	defined := definedMetrics(t)
	defined["up"] = true
	kubeScheduler := kubeSchedulerMetrics(t)
	var scrape struct {
		ScrapeConfigs []struct {
			JobName string `json:"job_name"`
		} `json:"scrape_configs"`
	}
	readYAML(t, scrapeConfigPath, &scrape)
	var jobs []string
	for _, sc := range scrape.ScrapeConfigs {
		jobs = append(jobs, sc.JobName)
	}
	var rules ruleFile
	readYAML(t, ruleFilePath, &rules)
	tests := []struct {
		name  string
		check func(t *testing.T, rule, expr string)
	}{
		{name: "metrics", check: func(t *testing.T, rule, expr string) {
			for _, m := range metricRE.FindAllString(expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					base = strings.TrimSuffix(base, suffix)
				}
				if !defined[m] && !defined[base] {
					t.Errorf("%s names %s, which package metrics does not define", rule, m)
				}
			}
		}},
		{name: "kube-scheduler metrics", check: func(t *testing.T, rule, expr string) {
			for _, m := range kubeSchedulerMetricRE.FindAllStringSubmatch(expr, -1) {
				base := m[1]
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if _, ok := kubeScheduler[base]; !ok {
						base = strings.TrimSuffix(base, suffix)
					}
				}
				labels, ok := kubeScheduler[base]
				if !ok {
					t.Errorf("%s names %s, which kube-scheduler v1.37.2 does not serve (%s)", rule, m[1], kubeSchedulerMetricsPath)
					continue
				}
				for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
					if !slices.Contains(labels, lm[1]) && !slices.Contains(targetLabels, lm[1]) {
						t.Errorf("%s selects %s by label %q; its series carry %v and the target's %v", rule, m[1], lm[1], labels,
							targetLabels)
					}
				}
			}
		}},
		{name: "jobs", check: func(t *testing.T, rule, expr string) {
			for _, m := range jobRE.FindAllStringSubmatch(expr, -1) {
				for _, job := range strings.Split(m[1], "|") {
					if !slices.Contains(jobs, job) {
						t.Errorf("%s names job %q; %s has %v", rule, job, scrapeConfigPath, jobs)
					}
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, g := range rules.Groups {
				for _, r := range g.Rules {
					tt.check(t, r.Alert+r.Record, r.Expr)
				}
			}
		})
	}
}

// kustomization is the part of a kustomization.yaml the packaging test reads.
type kustomization struct {
	Kind               string   `json:"kind"`
	Resources          []string `json:"resources"`
	ConfigMapGenerator []struct {
		Name    string   `json:"name"`
		Files   []string `json:"files"`
		Options struct {
			DisableNameSuffixHash bool `json:"disableNameSuffixHash"`
		} `json:"options"`
	} `json:"configMapGenerator"`
}

// TestPackaging: the rule file is the ConfigMap understory-prometheus-rules of
// manifests/monitoring (a stable name to mount), and the PrometheusRule is only in its
// Component, so that `kubectl apply -k manifests/` needs no Operator CRD.
func TestPackaging(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		path  string
		check func(t *testing.T, k kustomization)
	}{
		{name: "rules ConfigMap", path: "manifests/monitoring/kustomization.yaml", check: func(t *testing.T, k kustomization) {
			for _, g := range k.ConfigMapGenerator {
				if g.Name == "understory-prometheus-rules" {
					if !slices.Equal(g.Files, []string{filepath.Base(ruleFilePath)}) || !g.Options.DisableNameSuffixHash {
						t.Errorf("understory-prometheus-rules: files %v, disableNameSuffixHash %v; want [%s], true",
							g.Files, g.Options.DisableNameSuffixHash, filepath.Base(ruleFilePath))
					}
					return
				}
			}
			t.Error("no configMapGenerator understory-prometheus-rules")
		}},
		{name: "PrometheusRule component", path: "manifests/components/prometheusrule/kustomization.yaml",
			check: func(t *testing.T, k kustomization) {
				if k.Kind != "Component" || !slices.Equal(k.Resources, []string{filepath.Base(prometheusRulePath)}) {
					t.Errorf("kind %q, resources %v; want a Component of [%s]", k.Kind, k.Resources, filepath.Base(prometheusRulePath))
				}
			}},
		{name: "base without the Operator", path: "manifests/base/kustomization.yaml", check: func(t *testing.T, k kustomization) {
			for _, r := range k.Resources {
				if strings.Contains(r, "prometheusrule") || strings.Contains(r, "servicemonitor") {
					t.Errorf("base includes %s: clusters without the Prometheus Operator could not apply it", r)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var k kustomization
			readYAML(t, tt.path, &k)
			tt.check(t, k)
		})
	}
}
