package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/understory/understory/contract"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/understory/understory/internal/controlplane"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/test/e2e/extenderharness"
)

// lossyProxy is a plain-http reverse proxy in front of the API server (it
// authenticates upstream with the admin certificate). For the pods in
// loseBind it forwards the Binding POST, lets the API server apply it, and
// then drops the connection instead of answering: the Binding happened, its
// answer is lost. For the pods in failGet it answers the next GET of the pod
// (the extender's read back) with a 500.
type lossyProxy struct {
	rp *httputil.ReverseProxy
	hs *httptest.Server

	mu       sync.Mutex
	loseBind map[string]int // namespace/name → Binding answers still to lose
	failGet  map[string]int // namespace/name → GETs still to fail
	lost     []string       // namespace/name of every Binding whose answer was lost
}

func startLossyProxy(t *testing.T, cp *controlplane.ControlPlane) *lossyProxy {
	t.Helper()
	upstream, err := url.Parse(cp.URL())
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{loseBind: map[string]int{}, failGet: map[string]int{}}
	p.rp = httputil.NewSingleHostReverseProxy(upstream)
	p.rp.Transport = tr
	p.rp.FlushInterval = -1 // watches stream
	p.hs = httptest.NewServer(p)
	t.Cleanup(p.hs.Close)
	return p
}

// RESTConfig is a client config for the proxy (plain http, no credentials:
// the proxy adds them upstream).
func (p *lossyProxy) RESTConfig() *rest.Config {
	return &rest.Config{Host: p.hs.URL, QPS: -1, UserAgent: "understory-e2e-lossy"}
}

// podPath splits /api/v1/namespaces/NS/pods/NAME[/SUB] into NS/NAME and SUB.
func podPath(path string) (key, sub string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(path, "/api/v1/namespaces/"), "/")
	if !strings.HasPrefix(path, "/api/v1/namespaces/") || len(parts) < 3 || parts[1] != "pods" {
		return "", "", false
	}
	if len(parts) > 3 {
		sub = parts[3]
	}
	return parts[0] + "/" + parts[2], sub, true
}

// take decrements m[key] if positive.
func (p *lossyProxy) take(m map[string]int, key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m[key] > 0 {
		m[key]--
		return true
	}
	return false
}

func (p *lossyProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, sub, ok := podPath(r.URL.Path)
	switch {
	case ok && r.Method == http.MethodPost && sub == "binding" && p.take(p.loseBind, key):
		rec := httptest.NewRecorder()
		p.rp.ServeHTTP(rec, r) // the API server applies the Binding
		p.mu.Lock()
		p.lost = append(p.lost, fmt.Sprintf("%s (%d)", key, rec.Code))
		p.mu.Unlock()
		panic(http.ErrAbortHandler) // and the answer never arrives
	case ok && r.Method == http.MethodGet && sub == "" && p.take(p.failGet, key):
		http.Error(w, "lossy proxy: injected read failure", http.StatusInternalServerError)
	default:
		p.rp.ServeHTTP(w, r)
	}
}

func (p *lossyProxy) lostAnswers() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lost)
}

// TestExtenderLostBindingAnswers runs the extender behind a proxy that lets
// the API server apply Bindings but drops their answers, under the real
// kube-scheduler. Pods whose read back works are confirmed bound at once; a
// pod whose read back fails too gets an error (kube-scheduler retries it),
// keeps its devices until the informer shows it bound, and is bound exactly
// once; a gang whose commit loses every answer is bound whole. No device is
// ever given to two pods, and the index agrees with the annotations.
func TestExtenderLostBindingAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real control plane; skipped in -short mode")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cp := controlplane.Start(ctx, t, controlplane.Options{})
	proxy := startLossyProxy(t, cp)
	ext := extenderharness.Start(ctx, t, cp, extenderharness.Options{TrackPods: true, RESTConfig: proxy.RESTConfig()})
	manifest, err := controlplane.ReadSchedulerManifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := controlplane.ManifestSchedulerConfig(manifest, ext.URL())
	if err != nil {
		t.Fatal(err)
	}
	cp.StartScheduler(t, cfg)
	c := &cluster{ctx: ctx, cp: cp, ext: ext}

	const ns = "e2e-lossy"
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// 2 × 4 GPUs for 4 single pods (one of them shares) and a gang of 3.
	c.nodes(t, ns, twoNodes(4, modelA100)...)
	binds := watchBinds(t, c, ns)
	singles := []podSpec{{name: "lost-0", gpus: 1}, {name: "lost-1", gpus: 1}, {name: "lost-share", milli: 500},
		{name: "unconfirmed", gpus: 1}}
	for _, s := range singles {
		proxy.loseBind[ns+"/"+s.name] = 1
	}
	proxy.failGet[ns+"/unconfirmed"] = 1
	c.waitBound(t, ns, c.create(t, ns, singles...)...)

	const minMember = 3
	var members []podSpec
	for i := range minMember {
		m := memberSpec(extender.DialectKoordinator, minMember, i, 1, 0)
		proxy.loseBind[ns+"/"+m.name] = 1
		members = append(members, m)
	}
	bound := c.waitBound(t, ns, c.create(t, ns, members...)...)
	c.checkBoundWhole(t, ns, bound, binds, minMember)
	c.checkGangAdmitted(t, ns, minMember)

	lost := proxy.lostAnswers()
	if len(lost) != len(singles)+minMember {
		t.Errorf("answers lost for %v, want one per pod (%d)", lost, len(singles)+minMember)
	}
	for _, l := range lost {
		if !strings.HasSuffix(l, "(201)") {
			t.Errorf("the API server did not apply a Binding whose answer was lost: %s", l)
		}
	}
	checkDevicesAgree(t, ctx, cp.Client(), ns, func() extender.Status { return ext.Server().Status() })
	if got, err := ext.Metric("understory_extender_binds_total", "result", "error"); err != nil || got != 1 {
		t.Errorf("binds_total{result=error} = %v (%v), want 1 (the unconfirmed bind)", got, err)
	}
}

// device is one GPU of a node.
type device struct {
	node string
	idx  int
}

// checkDevices reads every pod of namespace ns (all namespaces when empty)
// and checks that each bound GPU pod's understory.io/gpu-devices names as
// many distinct devices as it asks for, all below its node's GPU count, and
// that no device holds more than 1000 milli. It returns who holds each device
// and how much.
func checkDevices(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string) (map[device][]string, map[device]int) {
	t.Helper()
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gpus := map[string]int{}
	for _, n := range nodes.Items {
		q := n.Status.Allocatable[contract.ResourceGPU]
		gpus[n.Name] = int(q.Value())
	}
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owners, milli := map[device][]string{}, map[device]int{}
	for i := range pods.Items {
		p := &pods.Items[i]
		req, err := extender.PodRequest(p)
		if err != nil || req.NumGPU == 0 || p.Spec.NodeName == "" {
			continue
		}
		for _, d := range devices(t, p, gpus[p.Spec.NodeName]) {
			k := device{p.Spec.NodeName, d}
			milli[k] += req.GPUMilli
			owners[k] = append(owners[k], p.Namespace+"/"+p.Name)
		}
	}
	for k, m := range milli {
		if m > contract.MilliPerGPU {
			t.Errorf("node %s device %d is booked for %d milli by %v", k.node, k.idx, m, owners[k])
		}
	}
	return owners, milli
}

// checkDevicesAgree is checkDevices plus the extender's index (status) for
// the nodes holding pods of ns: each device's pods and milli must match the
// annotations. The index follows the informer: it gets a few seconds.
func checkDevicesAgree(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, status func() extender.Status) int {
	t.Helper()
	owners, milli := checkDevices(t, ctx, c, ns)
	nodes := map[string]bool{}
	for k := range owners {
		nodes[k.node] = true
	}
	var diff []string
	for range 50 {
		diff = diff[:0]
		for _, n := range status().Nodes {
			if !nodes[n.Name] {
				continue
			}
			for _, g := range n.GPUs {
				k := device{n.Name, g.Index}
				want := slices.Sorted(slices.Values(owners[k]))
				if !slices.Equal(g.Pods, want) || g.AllocatedMilli != milli[k] {
					diff = append(diff, fmt.Sprintf("%s/%d: index %v %d milli, annotations %v %d milli",
						n.Name, g.Index, g.Pods, g.AllocatedMilli, want, milli[k]))
				}
			}
		}
		if len(diff) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(diff) > 0 {
		t.Errorf("extender index disagrees with the gpu-devices annotations:\n%s", strings.Join(diff, "\n"))
	}
	n := 0
	for _, o := range owners {
		n += len(o)
	}
	return n
}
