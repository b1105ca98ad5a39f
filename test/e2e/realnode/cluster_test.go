package realnode

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/test/e2e/manifestcopy"
)

// Names of the install (manifests/), spelled out there too.
const (
	nsSystem        = "understory-system"
	agentLabel      = "app.kubernetes.io/name=understory-koordlet"
	extenderName    = "understory-scheduler-extender"
	admissionName   = "understory-admission"
	extenderServer  = "understory-scheduler-extender.understory-system.svc"
	agentPort       = 9316
	extenderPort    = 8888
	realnodeOverlay = "overlays/realnode"
)

// builtImage is one entry of bin/images/images.json (cmd/mkimage).
type builtImage struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
	Tar  string `json:"tar"`
}

// installImages are the images manifests/overlays/realnode runs.
var installImages = []string{"koordlet-nogpu", "scheduler-extender", "admission"}

// builtImages reads the images `make images` wrote (bin/images) and returns their
// common tag and the tarballs of installImages. Without them the test skips (fails
// under CI=true): `make e2e` builds them first.
func builtImages(t *testing.T, repo string) (version string, tars []string) {
	t.Helper()
	dir := filepath.Join(repo, "bin", "images")
	data, err := os.ReadFile(filepath.Join(dir, "images.json"))
	if err != nil {
		testenv.SkipOrFailInCI(t, "the project's images are not built (%v): run `make images` (make e2e does)", err)
	}
	var list []builtImage
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatalf("%s/images.json: %v", dir, err)
	}
	byName := map[string]builtImage{}
	for _, b := range list {
		byName[b.Name] = b
	}
	for _, name := range installImages {
		b, ok := byName[name]
		if !ok {
			t.Fatalf("%s/images.json has no image %s (make images)", dir, name)
		}
		repoName, tag, ok := strings.Cut(b.Ref, ":")
		if !ok || repoName != "understory/"+name || tag == "" || tag == "latest" {
			t.Fatalf("image %s: ref %q, want understory/%s:<version>", name, b.Ref, name)
		}
		if version != "" && tag != version {
			t.Fatalf("images of different versions in %s: %s and %s (make images again)", dir, version, tag)
		}
		version = tag
		tar := filepath.Join(dir, b.Tar)
		if _, err := os.Stat(tar); err != nil {
			t.Fatalf("image %s: %v (make images)", name, err)
		}
		tars = append(tars, tar)
	}
	return version, tars
}

// copyManifests copies manifests/ into a temp dir (without certs/generated) and writes
// the certificates there with certs/generate.sh, so the checkout stays untouched. The
// overlay is applied as it is, as the README says: its image tags must be the version
// `make images` gave the images (the VERSION file); a mismatch fails the test.
func copyManifests(t *testing.T, repo, version string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "manifests")
	if err := manifestcopy.Copy(filepath.Join(repo, "manifests"), dst); err != nil {
		if errors.Is(err, manifestcopy.ErrNoOpenSSL) {
			testenv.SkipOrFailInCI(t, "%v", err)
		}
		t.Fatal(err)
	}
	for _, k := range []string{filepath.Join(dst, "base"), filepath.Join(dst, realnodeOverlay)} {
		tags, err := manifestcopy.ImageTags(filepath.Join(k, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if len(tags) == 0 {
			t.Fatalf("%s/kustomization.yaml has no images:", k)
		}
		for name, tag := range tags {
			if tag != version {
				t.Fatalf("%s asks for %s:%s but the built images are %s: run `make images` (it tags them with the "+
					"VERSION file, which the manifests must name)", k, name, tag, version)
			}
		}
	}
	return dst
}

// kustomizations lists every directory under root whose kustomization.yaml is a
// Kustomization (not a Component), root first: what a user may `kubectl apply -k`.
func kustomizations(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var k struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(data, &k); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if k.Kind == "" || k.Kind == "Kustomization" {
			out = append(out, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ctl runs scripts/realnode/ctl.sh DIR name what.
func (n *node) ctl(name, what string) error {
	out, err := exec.Command(filepath.Join(n.repo, "scripts", "realnode", "ctl.sh"), n.dir, name, what).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctl.sh %s %s: %s: %w", name, what, strings.TrimSpace(string(out)), err)
	}
	return nil
}

// readyPod waits for the one pod of ns matching selector that runs, is Ready and is
// not being deleted (other than not), and returns it.
func (n *node) readyPod(ctx context.Context, t *testing.T, ns, selector, not string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	var last string
	err := poll(ctx, timeout, func() (bool, error) {
		l, err := n.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%d pods", len(l.Items))
		for i := range l.Items {
			p := &l.Items[i]
			if p.Name == not || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || !podReady(p) {
				continue
			}
			got = p
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no ready pod %s in %s: %v (%s)", selector, ns, err, last)
	}
	return got
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// restarts sums the restart counts of the pod's containers.
func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// hostPID returns the host PID of a process of the container (its cpu cgroup ends in
// the container ID).
func hostPID(cid string) (int, error) {
	procs, err := processesOf(cid)
	if err != nil {
		return 0, err
	}
	best := 0
	for pid := range procs {
		if best == 0 || pid < best {
			best = pid
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("no process of container %s", cid)
	}
	return best, nil
}

// procStatusField returns a field of /proc/<pid>/status (e.g. "CapEff").
func procStatusField(pid int, field string) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == field {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// processStart is when the process started, from /proc/<pid>/stat (clock ticks since
// boot) and the boot time of /proc/stat: 10 ms resolution.
func processStart(pid int) (time.Time, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	// The command name (field 2) may contain spaces; fields restart after its ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64) // field 22: starttime
	if err != nil {
		return time.Time{}, fmt.Errorf("/proc/%d/stat starttime: %w", pid, err)
	}
	st, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			const clkTck = 100 // USER_HZ on Linux
			return time.Unix(boot, 0).Add(time.Duration(ticks) * time.Second / clkTck), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat has no btime")
}

// cgroupUsage is cpuacct.usage (ns) of a relative cgroup.
func cgroupUsage(rel string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "cpuacct", rel, "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// quotaCores is the cgroup's CFS quota in cores, -1 when unlimited.
func quotaCores(rel string) (float64, error) {
	s, err := readCPUSettings(rel)
	if err != nil {
		return 0, err
	}
	q, err1 := strconv.ParseFloat(s.Quota, 64)
	p, err2 := strconv.ParseFloat(s.Period, 64)
	if err := errors.Join(err1, err2); err != nil || p <= 0 {
		return 0, fmt.Errorf("%s: quota %q period %q: %w", rel, s.Quota, s.Period, err)
	}
	if q < 0 {
		return -1, nil
	}
	return q / p, nil
}

// frozen says whether the cgroup's v1 freezer holds it (FROZEN or FREEZING). A group
// frozen by an ancestor reads THAWED itself but self_freezing/parent_freezing say so.
func frozen(rel string) bool {
	dir := filepath.Join(cgroupRoot, "freezer", rel)
	st, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if err != nil {
		return false
	}
	if s := strings.TrimSpace(string(st)); s == "FROZEN" || s == "FREEZING" {
		return true
	}
	pf, err := os.ReadFile(filepath.Join(dir, "freezer.parent_freezing"))
	return err == nil && strings.TrimSpace(string(pf)) == "1"
}

// usageMeter measures the CPU rate of cgroups between two calls.
type usageMeter struct {
	at   time.Time
	last map[string]int64
}

func newUsageMeter(rels ...string) (*usageMeter, error) {
	m := &usageMeter{at: time.Now(), last: map[string]int64{}}
	for _, r := range rels {
		u, err := cgroupUsage(r)
		if err != nil {
			return nil, err
		}
		m.last[r] = u
	}
	return m, nil
}

// rates returns each cgroup's cores since the meter was made.
func (m *usageMeter) rates() (map[string]float64, error) {
	d := time.Since(m.at).Seconds()
	out := map[string]float64{}
	for r, u0 := range m.last {
		u, err := cgroupUsage(r)
		if err != nil {
			return nil, err
		}
		out[r] = float64(u-u0) / 1e9 / d
	}
	return out, nil
}

// agentClient talks to the agent's pod: /healthz, /status (plain HTTP on the pod IP).
type agentClient struct {
	base string
	hc   *http.Client
}

func newAgentClient(ip string) *agentClient {
	return &agentClient{base: fmt.Sprintf("http://%s:%d", ip, agentPort), hc: &http.Client{Timeout: 3 * time.Second}}
}

func (a *agentClient) healthy(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (a *agentClient) status(ctx context.Context) (koordlet.Status, error) {
	var s koordlet.Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return s, fmt.Errorf("GET /status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /status: %s", resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// extenderClient calls the extender the way kube-scheduler does: HTTPS to its
// Service's ClusterIP (kube-proxy's rules), the Service's name as server name, the
// client certificate manifests/certs issued for kube-scheduler.
type extenderClient struct {
	base string
	hc   *http.Client
}

func newExtenderClient(t *testing.T, certs, clusterIP string) *extenderClient {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("%s/ca.crt holds no certificate", certs)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(certs, "scheduler-client.crt"), filepath.Join(certs, "scheduler-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair},
		ServerName: extenderServer, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	return &extenderClient{base: fmt.Sprintf("https://%s:%d", clusterIP, extenderPort),
		hc: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

func (e *extenderClient) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (e *extenderClient) status(ctx context.Context) (extender.Status, error) {
	var s extender.Status
	code, b, err := e.do(ctx, http.MethodGet, "/status", nil)
	if err != nil {
		return s, err
	}
	if code != http.StatusOK {
		return s, fmt.Errorf("GET /status: %d %s", code, b)
	}
	return s, json.Unmarshal(b, &s)
}

// bind posts ExtenderBindingArgs as kube-scheduler does.
func (e *extenderClient) bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) (int, string, error) {
	body, err := json.Marshal(args)
	if err != nil {
		return 0, "", err
	}
	code, b, err := e.do(ctx, http.MethodPost, "/bind", body)
	return code, string(b), err
}

// counter returns the value of a counter in /metrics with exactly these labels (0
// when the series does not exist yet).
func (e *extenderClient) counter(ctx context.Context, name string, labels map[string]string) (float64, error) {
	code, b, err := e.do(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return 0, fmt.Errorf("parsing /metrics: %w", err)
	}
	fam, ok := fams[name]
	if !ok {
		return 0, nil
	}
	for _, m := range fam.GetMetric() {
		match := len(m.GetLabel()) == len(labels)
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				match = false
			}
		}
		if match {
			return m.GetCounter().GetValue(), nil
		}
	}
	return 0, nil
}

// writeSchedulerConfig writes the shipped KubeSchedulerConfiguration
// (manifests/scheduler/kube-scheduler-config.yaml) for this node: only the
// kubeconfig, leader election (one scheduler), the extender's address (the Service's
// ClusterIP: a scheduler on the host does not resolve cluster DNS) and the file paths
// of the certificates change; serverName stays.
func writeSchedulerConfig(t *testing.T, manifests, certs, out, kubeconfig, clusterIP string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(manifests, "scheduler", "kube-scheduler-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cc, _ := cfg["clientConnection"].(map[string]any)
	if cc == nil {
		cc = map[string]any{}
		cfg["clientConnection"] = cc
	}
	cc["kubeconfig"] = kubeconfig
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	exts, _ := cfg["extenders"].([]any)
	if len(exts) != 1 {
		t.Fatalf("kube-scheduler-config.yaml: %d extenders, want 1", len(exts))
	}
	ext := exts[0].(map[string]any)
	ext["urlPrefix"] = fmt.Sprintf("https://%s:%d", clusterIP, extenderPort)
	tc, _ := ext["tlsConfig"].(map[string]any)
	if tc == nil || tc["serverName"] != extenderServer {
		t.Fatalf("kube-scheduler-config.yaml: tlsConfig %v, want serverName %s", tc, extenderServer)
	}
	tc["caFile"] = filepath.Join(certs, "ca.crt")
	tc["certFile"] = filepath.Join(certs, "scheduler-client.crt")
	tc["keyFile"] = filepath.Join(certs, "scheduler-client.key")
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// quotaPeriod is the cgroup's cpu.cfs_period_us.
func quotaPeriod(rel string) (int64, error) {
	s, err := cpuFile(rel, "cpu.cfs_period_us")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

// strconvQuota is cpu.cfs_quota_us for cores over period (µs).
func strconvQuota(cores float64, period int64) string {
	return strconv.FormatInt(int64(math.Round(cores*float64(period))), 10)
}

// writeQuota sets the cgroup's CFS quota to cores over its period.
func writeQuota(rel string, cores float64, period int64) error {
	p := filepath.Join(cgroupRoot, "cpu", rel, "cpu.cfs_quota_us")
	if err := os.WriteFile(p, []byte(strconvQuota(cores, period)), 0); err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}
