package realnode

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/understory/understory/cmd/dashboard-render/grafana"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/test/e2e/dashboards"
)

// scrapeInterval is how often TestInstall's Prometheus scrapes the agent and the
// extender: every 2 s on a 2-CPU machine whose LS pods burn both CPUs at times (a
// 1 s scrape timeout would lose scrapes then). $__rate_interval is 4 of them, as
// Grafana makes it.
const scrapeInterval = 2 * time.Second

// Why panels lack data on this node: what the install test does not have.
const (
	whyNoGPU = "no GPU on the test node: the agent runs the pure-Go image (understory/koordlet-nogpu), " +
		"which publishes only understory_gpu_available 0, and the extender's index holds no GPU"
	whyNoGang = "the install test creates no PodGroup (gang): understory_extender_gangs has a series per " +
		"gang state only once a gang exists"
)

// installExemptions are the panels and variables of manifests/grafana that may
// lack data on the real node (with cutExemptions, when the agent ran with a harm
// signal); every other panel and variable must show data. Checked against the
// shipped dashboards by TestInstallDashboardExemptions.
var installExemptions = []grafana.Exemption{
	// Every panel is the agent's GPU loop or dcgm-exporter's; its Node variable
	// lists the node (understory_gpu_available 0), its GPU variable nothing.
	{Dashboard: "understory-gpu", Reason: whyNoGPU},
	{Dashboard: "understory-gpu", Variable: "gpu", Reason: whyNoGPU},
	{Dashboard: "understory-node", Panel: "GPU used by LS and batch", Reason: whyNoGPU},
	{Dashboard: "understory-node", Panel: "GPU memory used by LS and batch pods", Reason: whyNoGPU},
	// gpu_milli_allocated / gpu_milli_capacity is 0 / 0: NaN. (The GPUs stat and the
	// GPU ledger show their zeros: they are checked.)
	{Dashboard: "understory-scheduler", Panel: "GPU allocated",
		Reason: whyNoGPU + " (allocated / capacity is 0 / 0, NaN)"},
	// Gang admissions and failures is checked: its counters start at 0 for every event.
	{Dashboard: "understory-scheduler", Panel: "Gangs by state", Reason: whyNoGang},
	// kube-scheduler exports the gauge only for a plugin that left a pod unschedulable.
	{Dashboard: "understory-scheduler", Panel: "Second scheduler: unschedulable pods by plugin",
		Reason: "no batch pod has to wait in this run: kube-scheduler's scheduler_unschedulable_pods has a series " +
			"only for a plugin that rejected a pod"},
}

// kueuePanels are the Kueue quota follower's row: the install test runs no Kueue
// (TestDashboardsOnPrometheus runs the real follower and proves them).
var kueuePanels = []string{"Follower leading", "Last pass age", "Workloads evicted since start",
	"Follower errors in range", "Quota follower: batch CPU", "Quota follower: batch memory",
	"Quota follower: writes, evictions and requeues"}

// whyNoKueue says why kueuePanels lack data here.
const whyNoKueue = "the install test runs no Kueue and no quota follower (kueue.enabled is off in the " +
	"realnode values); TestDashboardsOnPrometheus runs the real follower"

// allInstallExemptions is installExemptions with the quota follower's row.
func allInstallExemptions() []grafana.Exemption {
	out := slices.Clone(installExemptions)
	for _, p := range kueuePanels {
		out = append(out, grafana.Exemption{Dashboard: "understory-scheduler", Panel: p, Reason: whyNoKueue})
	}
	return out
}

// cutReactionPanels need a budget cut in the window: without one their quantiles
// (and the mean, 0 / 0) are NaN.
var cutReactionPanels = []string{"Cut reaction p50", "Cut reaction p99", "Time from LS load to batch cut"}

// cutExemptions exempt cutReactionPanels when the agent ran with an LS harm signal
// (sources: those understory_signal_source reported active other than sampling).
// The realnode overlay leaves signals.mode at auto: eBPF where the pod may load it
// (here), else PSI where the node has cgroup2 pressure files. Then batch is cut only on
// measured LS harm (with eBPF: harm batch caused), which the test's load does not
// guarantee (stages 5, 7 and 8 also
// accept batch frozen, and the freeze follows the utilisation budget); in sampling
// mode every LS load cuts and the panels must show data.
func cutExemptions(sources []string) []grafana.Exemption {
	if len(sources) == 0 {
		return nil
	}
	reason := fmt.Sprintf("the agent ran with the LS harm signal %s: batch is cut only on measured LS harm, "+
		"which this test's load does not guarantee (its stages also accept a freeze)", strings.Join(sources, ", "))
	var out []grafana.Exemption
	for _, title := range cutReactionPanels {
		out = append(out, grafana.Exemption{Dashboard: "understory-ls-harm", Panel: title, Reason: reason})
	}
	return out
}

// harmSources returns the harm signal sources other than sampling that an agent
// reported active at some time in w.
func harmSources(ctx context.Context, api v1.API, w grafana.Window) ([]string, error) {
	q := fmt.Sprintf(`max by (source) (max_over_time(understory_signal_source[%ds])) == 1`,
		int(w.End.Sub(w.Start).Seconds())+1)
	v, _, _, err := api.Query(ctx, q, w.End)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", q, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("%s: a %s, want a vector", q, v.Type())
	}
	var out []string
	for _, smp := range vec {
		if src := string(smp.Metric["source"]); src != "sampling" && !slices.Contains(out, src) {
			out = append(out, src)
		}
	}
	slices.Sort(out)
	return out, nil
}

// instances is how many scrape targets (instance labels) Prometheus has samples of
// metric from now (0 when the query fails: the caller polls).
func instances(ctx context.Context, api v1.API, metric string) int {
	v, _, _, err := api.Query(ctx, fmt.Sprintf("count by (instance) (%s)", metric), time.Now())
	if err != nil {
		return 0
	}
	vec, _ := v.(model.Vector)
	return len(vec)
}

// TestInstallDashboardExemptions: every exemption of TestInstall's dashboard stage
// names a panel or variable of the shipped dashboards (no root, no node).
func TestInstallDashboardExemptions(t *testing.T) {
	t.Parallel()
	ds, err := grafana.Load(filepath.Join(repoRoot(t), "manifests", "grafana"))
	if err != nil {
		t.Fatal(err)
	}
	if cutExemptions(nil) != nil {
		t.Error("cut-reaction panels exempt in sampling mode")
	}
	all := append(allInstallExemptions(), cutExemptions([]string{"psi"})...)
	if err := grafana.ValidateExemptions(ds, all); err != nil {
		t.Error(err)
	}
}

// scrapeJobs are the jobs of manifests/monitoring/prometheus-scrape.yaml as static
// targets: the agent's pod over HTTP with the node and pod labels that file's
// relabelling gives, every extender pod over HTTPS verified with the install's CA
// and the Service's name, without a client certificate (the extender serves
// /metrics to anyone; the shipped job has none either).
func (in *install) scrapeJobs(agent *corev1.Pod, exts, scheds []*corev1.Pod) []dashboards.ScrapeJob {
	ext := dashboards.ScrapeJob{Name: "understory-scheduler-extender", Scheme: "https",
		TLS: &dashboards.TLSConfig{CAFile: filepath.Join(in.certs, "ca.crt"), ServerName: extenderServer}}
	for _, p := range exts {
		ext.Targets = append(ext.Targets, dashboards.ScrapeTarget{
			Address: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(extenderPort)),
			Labels:  map[string]string{"pod": p.Name},
		})
	}
	return []dashboards.ScrapeJob{
		{Name: "understory-koordlet", Targets: []dashboards.ScrapeTarget{{
			Address: net.JoinHostPort(agent.Status.PodIP, strconv.Itoa(agentPort)),
			Labels:  map[string]string{"node": agent.Spec.NodeName, "pod": agent.Name},
		}}},
		ext,
		in.schedulerJob(scheds),
	}
}

// schedulerJob is the second scheduler's job as manifests/monitoring/prometheus-scrape.yaml
// has it: every replica's secure port, over HTTPS with verification off (kube-scheduler
// signs its own certificate at start), with a service account's token that the
// shipped ClusterRole understory-scheduler-metrics-reader lets read /metrics.
func (in *install) schedulerJob(scheds []*corev1.Pod) dashboards.ScrapeJob {
	j := dashboards.ScrapeJob{Name: "understory-scheduler", Scheme: "https",
		TLS: &dashboards.TLSConfig{InsecureSkipVerify: true}, BearerTokenFile: in.schedToken}
	for _, p := range scheds {
		j.Targets = append(j.Targets, dashboards.ScrapeTarget{
			Address: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(secondSchedulerPort)),
			Labels:  map[string]string{"pod": p.Name},
		})
	}
	return j
}

// schedulerToken binds a service account, as a Prometheus in a pod runs as, to the
// shipped ClusterRole understory-scheduler-metrics-reader and writes a token of it
// for the scrape (docs/second-scheduler.md, "Metrics").
func (in *install) schedulerToken(ctx context.Context) (string, error) {
	c := in.n.client
	const ns, sa = "monitoring", "prometheus"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"understory.io/metrics-scraper": "true"}}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "understory-e2e-prometheus-scheduler-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "understory-scheduler-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3 * 3600))}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	path := filepath.Join(in.promDir, "scheduler-token")
	return path, os.WriteFile(path, []byte(tr.Status.Token), 0o600)
}

// seedSchedulerSeries has the second scheduler place one pod before the first scrape.
// kube-scheduler creates a series of its attempt histograms at its first observation,
// and increase() cannot count a series' first sample: a process whose only attempts
// come after the first scrape would show none (a cluster's long-running scheduler has
// its series already). The pod is deleted once placed.
func (in *install) seedSchedulerSeries(t *testing.T) {
	t.Helper()
	ctx, n := in.ctx, in.n
	p := n.podSpec("seed-second-scheduler", nil, corev1.ResourceRequirements{Requests: cpuMem("10m", "8Mi")})
	p.Spec.SchedulerName = secondScheduler
	if _, err := n.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := poll(ctx, 60*time.Second, func() (bool, error) {
		got, err := n.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && got.Spec.NodeName != "", nil
	})
	if err != nil {
		t.Fatalf("the second scheduler did not place pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	if err := n.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// schedulerPods returns the second scheduler's running pods with an IP, by name.
func (in *install) schedulerPods(ctx context.Context) ([]*corev1.Pod, error) {
	return in.runningPods(ctx, "app.kubernetes.io/name="+secondScheduler)
}

// extenderPods returns the extender's running pods with an IP, sorted by name: like the
// shipped job, Prometheus scrapes the leader and the standby. With only the leader of
// stage 3b scraped, the filter-latency panel once had no data in a run where stage 8's
// outage handed the Lease to the other replica.
func (in *install) extenderPods(ctx context.Context) ([]*corev1.Pod, error) {
	return in.runningPods(ctx, "app.kubernetes.io/name="+extenderName)
}

// runningPods returns the running pods of the release matching selector that have an
// IP, sorted by name.
func (in *install) runningPods(ctx context.Context, selector string) ([]*corev1.Pod, error) {
	l, err := in.n.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var out []*corev1.Pod
	for i := range l.Items {
		p := &l.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// samePods reports whether a and b name the same pods at the same IPs.
func samePods(a, b []*corev1.Pod) bool {
	return slices.EqualFunc(a, b, func(x, y *corev1.Pod) bool {
		return x.Name == y.Name && x.Status.PodIP == y.Status.PodIP
	})
}

// scrape: Debian's Prometheus, on this host, scrapes the agent's and the extender's
// pods at their IPs from here to the end of the run, for stage 9. The server
// outlives this subtest (TestInstall stops it); when it cannot run here the stage
// is skipped, and stage 9 with it (both fail under CI=true).
func (in *install) scrape(t *testing.T) {
	ctx := in.ctx
	bin := dashboards.FindPrometheus(t)
	// Every extender pod, once one leads: the standby serves no scheduling calls until
	// it takes the Lease over (stage 8 may hand it over).
	ext := in.extenderLeader(t, 30*time.Second)
	exts, err := in.extenderPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scheds, err := in.schedulerPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in.seedSchedulerSeries(t)
	if in.schedToken, err = in.schedulerToken(ctx); err != nil {
		t.Fatalf("a token to read the second scheduler's /metrics: %v", err)
	}
	agent := in.agentPod
	p, err := dashboards.Launch(ctx, dashboards.PrometheusOptions{Jobs: in.scrapeJobs(agent, exts, scheds),
		ScrapeInterval: scrapeInterval, Binary: bin}, in.promDir)
	if err != nil {
		t.Fatal(err)
	}
	in.prom, in.extPods, in.schedPods, in.scraped = p, exts, scheds, agent
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = p.WaitTargetsUp(wctx, 1+len(exts)+len(scheds))
	in.promStart = time.Now()
	if err == nil {
		// Every target is scraped once inside the checked window before stage 4 starts:
		// a counter's increase over the window starts from that sample, so the
		// scheduling stage 4 does right away counts.
		err = p.WaitScrapedAfter(wctx, in.promStart)
	}
	if err != nil {
		t.Fatalf("Prometheus scraping the agent and the extender as manifests/monitoring/prometheus-scrape.yaml "+
			"does: %v\nits log:\n%s", err, p.LogTail(20))
	}
	t.Logf("Prometheus (%s) scrapes the agent %s at http://%s:%d/metrics and the extender's %d pods (leader %s at "+
		"%s) at https://<pod IP>:%d/metrics (CA certs/generated/ca.crt, server name %s, no client certificate) and the "+
		"second scheduler's %d pods at https://<pod IP>:%d/metrics with a token bound to "+
		"understory-scheduler-metrics-reader, every %v",
		p.URL(), agent.Name, agent.Status.PodIP, agentPort, len(exts), ext.Name, ext.Status.PodIP, extenderPort,
		extenderServer, len(scheds), secondSchedulerPort, scrapeInterval)
}

// followPods points the scrape targets at the current pods when they changed: the
// agent's DaemonSet pod (stage 7 deletes it; its replacement has a new IP) and the
// extender's pods (a replaced one has a new IP; one restarted in place, as stage 8's
// leader is, keeps it). It runs after every stage, so a new pod is scraped from the end
// of the stage that made it; the gap in between is its restart. The series keep their
// labels; the old pod's go stale. A failure is reported by stage 9.
func (in *install) followPods(t *testing.T) {
	if in.prom == nil {
		return
	}
	ctx, cancel := context.WithTimeout(in.ctx, 15*time.Second)
	defer cancel()
	l, err := in.n.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{LabelSelector: agentLabel})
	if err != nil {
		t.Logf("the scrape targets not checked after this stage: %v", err)
		return
	}
	agent := in.scraped
	for i := range l.Items {
		p := &l.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && podReady(p) {
			agent = p
		}
	}
	exts, err := in.extenderPods(ctx)
	if err != nil || len(exts) == 0 {
		exts = in.extPods // none running now (mid-restart): keep the last ones
	}
	scheds, err := in.schedulerPods(ctx)
	if err != nil || len(scheds) == 0 {
		scheds = in.schedPods
	}
	oldAgent, oldExts, oldScheds := in.scraped, in.extPods, in.schedPods
	agentMoved := agent.Name != oldAgent.Name || agent.Status.PodIP != oldAgent.Status.PodIP
	if !agentMoved && samePods(exts, oldExts) && samePods(scheds, oldScheds) {
		return
	}
	if err := in.prom.SetJobs(ctx, in.scrapeJobs(agent, exts, scheds)); err != nil {
		in.scrapeErrs = append(in.scrapeErrs, fmt.Sprintf("Prometheus could not follow the pods (agent %s at %s, "+
			"extender %s, second scheduler %s): %v", agent.Name, agent.Status.PodIP, podIPs(exts), podIPs(scheds), err))
		t.Logf("%s", in.scrapeErrs[len(in.scrapeErrs)-1])
		return
	}
	in.scraped, in.extPods, in.schedPods = agent, exts, scheds
	t.Logf("Prometheus now scrapes the agent's pod %s at %s (was %s at %s), the extender's %s (was %s) and the "+
		"second scheduler's %s (was %s)", agent.Name, agent.Status.PodIP, oldAgent.Name, oldAgent.Status.PodIP,
		podIPs(exts), podIPs(oldExts), podIPs(scheds), podIPs(oldScheds))
}

// podIPs lists pods as name@IP.
func podIPs(ps []*corev1.Pod) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name + "@" + p.Status.PodIP
	}
	return strings.Join(out, ", ")
}

// dashboardsHaveData: every panel and variable of the shipped dashboards
// (manifests/grafana) shows data over the run, from stage 3b's first scrape to the
// end of stage 8, but for installExemptions; those are reported apart.
func (in *install) dashboardsHaveData(t *testing.T) {
	if in.prom == nil {
		testenv.SkipOrFailInCI(t, "Prometheus did not run (stage 3b failed or was skipped): nothing to check the dashboards on")
	}
	for _, e := range in.scrapeErrs {
		t.Error(e)
	}
	ds, err := grafana.Load(filepath.Join(in.repo, "manifests", "grafana"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(in.ctx, 3*time.Minute)
	defer cancel()
	// The last scrapes of stage 8 (the batch pod bound after the outage) are stored.
	if err := in.prom.WaitScrapedAfter(ctx, time.Now()); err != nil {
		t.Fatalf("%v; Prometheus log:\n%s", err, in.prom.LogTail(20))
	}
	end := time.Now()
	in.logTargets(ctx, t)
	w := grafana.Window{Start: in.promStart, End: end, Step: scrapeInterval, RateInterval: 4 * scrapeInterval}
	harm, err := harmSources(ctx, in.prom.API(), w)
	if err != nil {
		t.Fatal(err)
	}
	if len(harm) == 0 {
		t.Logf("the agent ran in signals mode sampling: every LS load cuts batch, the cut-reaction panels must show data")
	}
	exempt := append(allInstallExemptions(), cutExemptions(harm)...)
	r, err := grafana.Check(ctx, in.prom.API(), ds, w, exempt...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Failed() {
		t.Errorf("no data: %v", p)
	}
	for _, v := range r.FailedVariables() {
		t.Errorf("%s variable %s lists nothing: %v", v.Dashboard, v.Name, v.Err)
	}
	// Apart: what the exemptions excused, by reason, and exempt targets that had
	// data anyway (an exemption wider than this node needs).
	byReason := map[string][]string{}
	var reasons, hadData []string
	note := func(reason, what string) {
		if !slices.Contains(reasons, reason) {
			reasons = append(reasons, reason)
		}
		byReason[reason] = append(byReason[reason], what)
	}
	exempted := r.Exempted()
	for _, p := range exempted {
		for _, reason := range p.Exempt() {
			note(reason, fmt.Sprintf("%s %q", p.Dashboard, p.Title))
		}
	}
	for _, v := range r.ExemptedVariables() {
		note(v.Exempt, fmt.Sprintf("%s variable %s", v.Dashboard, v.Name))
	}
	points := 0
	for _, p := range r.Panels {
		for _, tr := range p.Targets {
			points += tr.Points
			if tr.Exempt != "" && tr.Err == nil {
				hadData = append(hadData, fmt.Sprintf("%s %q %s", p.Dashboard, p.Title, tr.RefID))
			}
		}
	}
	var b strings.Builder
	for _, reason := range reasons {
		fmt.Fprintf(&b, "\n  %s:\n    %s", reason, strings.Join(byReason[reason], "\n    "))
	}
	t.Logf("%d panels of %d dashboards checked over the run's %v (scrape every %v, $__rate_interval %v): %d with "+
		"data (%d points), %d failed, %d exempt without data; %d variables, %d exempt without data:%s", len(r.Panels),
		len(ds), end.Sub(in.promStart).Round(time.Second), scrapeInterval, w.RateInterval, len(r.Panels)-
			len(r.Failed())-len(exempted), points, len(r.Failed()), len(exempted), len(r.Variables),
		len(r.ExemptedVariables()), b.String())
	if len(hadData) > 0 {
		t.Logf("exempt, yet with data: %s", strings.Join(hadData, "; "))
	}
	if t.Failed() {
		t.Logf("Prometheus log, last lines:\n%s", in.prom.LogTail(30))
	}
}

// logTargets logs each scrape target's health as Prometheus sees it now.
func (in *install) logTargets(ctx context.Context, t *testing.T) {
	t.Helper()
	ts, err := in.prom.API().Targets(ctx)
	if err != nil {
		t.Logf("Prometheus targets: %v", err)
		return
	}
	for _, tg := range ts.Active {
		t.Logf("target %s %s: %s, last scrape %v ago (%v) %s", tg.ScrapePool, tg.ScrapeURL, tg.Health,
			time.Since(tg.LastScrape).Round(100*time.Millisecond), tg.LastScrapeDuration, tg.LastError)
	}
}

// TestInstallHarmSources: harmSources reads the agent's understory_signal_source
// through a real Prometheus: the sources other than sampling that were active at
// any time, none for an agent in sampling mode (no root, no node).
func TestInstallHarmSources(t *testing.T) {
	t.Parallel()
	agent := func(active string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "# TYPE understory_signal_source gauge")
			for _, src := range []string{"ebpf", "psi", "sampling"} {
				v := 0
				if src == active {
					v = 1
				}
				fmt.Fprintf(w, "understory_signal_source{source=%q} %d\n", src, v)
			}
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	for _, tc := range []struct {
		name   string
		agents []string // the active source of each agent scraped (a restart: two)
		want   []string
	}{
		{"sampling", []string{"sampling"}, nil},
		{"psi", []string{"psi"}, []string{"psi"}},
		{"ebpf then sampling", []string{"ebpf", "sampling"}, []string{"ebpf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var targets []dashboards.ScrapeTarget
			for _, a := range tc.agents {
				targets = append(targets, dashboards.ScrapeTarget{Address: agent(a), Labels: map[string]string{"node": "n"}})
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			p := dashboards.StartPrometheus(ctx, t, dashboards.PrometheusOptions{
				Jobs: []dashboards.ScrapeJob{{Name: "understory-koordlet", Targets: targets}}})
			if err := p.WaitTargetsUp(ctx, len(targets)); err != nil {
				t.Fatal(err)
			}
			// A scrape of every agent is stored (up is set when it is reported).
			err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				return instances(ctx, p.API(), "understory_signal_source") == len(targets), nil
			})
			if err != nil {
				t.Fatalf("understory_signal_source of %d agents never stored: %v", len(targets), err)
			}
			got, err := harmSources(ctx, p.API(), grafana.Window{Start: start, End: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("harmSources = %v, want %v", got, tc.want)
			}
		})
	}
}
