package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	extender "github.com/understory/understory/scheduler-extender"
)

// Leader election of the failover test: shorter than the shipped 8 s / 5 s / 1 s
// (a killed leader is replaced after about LeaseDuration + RetryPeriod), so that
// ten failovers fit in the test's time; the shipped values are checked against
// 15 s by the extender's unit tests and measured at 5 000 nodes by
// cmd/extender-bench -runs failover.
const (
	failoverLease   = "3s"
	failoverRenew   = "2s"
	failoverRetry   = "250ms"
	failoverService = "e2e-extender"
	failoverNS      = "default" // the Lease's and the EndpointSlice's namespace
	failoverBudget  = 15 * time.Second
)

// haReplica is one replica of cmd/scheduler-extender with -leader-elect, a
// process of its own on a fixed address (so a fresh replica can take a killed
// one's place), pointing the Service at itself when it leads. It starts once
// synced (/syncz): leader or standby.
type haReplica struct {
	*extenderProcess
	id string
}

// hostIP is an address of this machine outside the loopback range: an
// EndpointSlice refuses loopback addresses.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	testenv.SkipOrFailInCI(t, "no IPv4 address outside loopback for the replicas' EndpointSlice")
	return ""
}

// freeAddr is a free TCP address on ip.
func freeAddr(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// newHAReplica: ownPod, when set, is the pod (in failoverNS) on which the
// replica writes its catch-up barrier when it takes over; without one it
// lists every bound pod to catch up ("namespace/name", or "").
func newHAReplica(t *testing.T, id, bin, kubeconfig, ip, ownPod string) *haReplica {
	p := newExtenderProcessAt(t, id, bin, kubeconfig, freeAddr(t, ip))
	p.readyPath, p.env = "/syncz", []string{"POD_IP=" + ip}
	p.args = func(n int) []string {
		return []string{"-leader-elect",
			"-leader-elect-namespace", failoverNS, "-leader-elect-identity", fmt.Sprintf("%s-%d", id, n),
			"-leader-elect-lease-duration", failoverLease, "-leader-elect-renew-deadline", failoverRenew,
			"-leader-elect-retry-period", failoverRetry, "-leader-elect-service", failoverService,
			"-leader-elect-port-name", "http", "-leader-elect-pod", ownPod}
	}

	return &haReplica{extenderProcess: p, id: id}
}

// leaderRoute is what kube-proxy does for the selector-less Service: it
// forwards to the address the Service's EndpointSlice names, as the leader
// wrote it (read from the API every 100 ms, about kube-proxy's own delay).
type leaderRoute struct {
	target atomic.Pointer[url.URL]
}

func startLeaderRoute(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane) *httptest.Server {
	t.Helper()
	lr := &leaderRoute{}
	slices := cp.Client().DiscoveryV1().EndpointSlices(failoverNS)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if es, err := slices.Get(rctx, failoverService+extender.LeaderSliceSuffix, metav1.GetOptions{}); err == nil {
				lr.set(es)
			}
			select {
			case <-rctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			if u := lr.target.Load(); u != nil {
				pr.SetURL(u)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "no leader reachable: "+err.Error(), http.StatusServiceUnavailable)
		},
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv
}

func (lr *leaderRoute) set(es *discoveryv1.EndpointSlice) {
	if len(es.Endpoints) != 1 || len(es.Endpoints[0].Addresses) != 1 || len(es.Ports) != 1 || es.Ports[0].Port == nil {
		return
	}
	lr.target.Store(&url.URL{Scheme: "http", Host: es.Endpoints[0].Addresses[0] + ":" + strconv.Itoa(int(*es.Ports[0].Port))})
}

// startHAExtenders starts replica a and waits until it leads, then replica b
// and waits until it refuses as a's standby, then kube-scheduler reaching the
// leader through the Service's EndpointSlice (startLeaderRoute). bBarrier is
// the pod ("namespace/name") on which b writes its catch-up barrier when it
// takes over, or "" for b to list the bound pods; a always lists them.
func startHAExtenders(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, bin, bBarrier string) ([2]*haReplica, *cluster) {
	t.Helper()
	ip := hostIP(t)
	replicas := [2]*haReplica{newHAReplica(t, "a", bin, cp.Kubeconfig(), ip, ""),
		newHAReplica(t, "b", bin, cp.Kubeconfig(), ip, bBarrier)}
	replicas[0].start(t, ctx)
	testenv.WaitFor(t, 30*time.Second, "a leading", func() bool {
		code, _ := replicas[0].probe(ctx, "/readyz")
		return code == http.StatusOK
	})
	replicas[1].start(t, ctx)
	testenv.WaitFor(t, 10*time.Second, "standby b refusing, naming leader a-1", func() bool {
		code, body := replicas[1].probe(ctx, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "standby: leader is a-1")
	})
	route := startLeaderRoute(t, ctx, cp)
	manifest, err := controlplane.ReadSchedulerManifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := controlplane.ManifestSchedulerConfig(manifest, route.URL)
	if err != nil {
		t.Fatal(err)
	}
	cp.StartScheduler(t, cfg)
	return replicas, &cluster{ctx: ctx, cp: cp}
}

// TestExtenderFailover runs two replicas of cmd/scheduler-extender with leader
// election against a real kube-apiserver and kube-scheduler, kube-scheduler
// reaching the leader through the EndpointSlice the leader writes. Under a
// steady stream of GPU pods (whole GPUs and shares) and two-member gangs, the
// leader is stopped 10 times (SIGKILL and SIGTERM in turn); each time the
// standby must lead and serve within 15 s, and a fresh standby takes the old
// one's place. No GPU device is ever booked beyond 1000 milli (a whole GPU is
// 1000) by the pods bound at any moment, as the API shows them, and the last
// leader's index agrees with the pods' devices annotations.
func TestExtenderFailover(t *testing.T) {
	ctx, cp, bin := controlPlaneAndExtenderBinary(t, 5*time.Minute)
	// b catches up through the barrier on its pod, a by listing the bound
	// pods: the failovers alternate between the two ways.
	barrierPod := controlplane.NewPod(failoverNS, "extender-b", nil)
	barrierPod.Spec.SchedulerName = "understory-e2e-nobody"
	if _, err := cp.Client().CoreV1().Pods(failoverNS).Create(ctx, barrierPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas, c := startHAExtenders(t, ctx, cp, bin, failoverNS+"/"+barrierPod.Name)

	const (
		ns        = "e2e-failover"
		failovers = 10
		live      = 8 // pods alive at once (a gang counts its members): at most 16 GPUs of 24
	)
	w, stream := startStreamOnSixNodes(t, c, ns, live)

	leader := 0
	var worst time.Duration
	for k := range failovers {
		// Let the leader bind some pods, then stop it mid-stream.
		before, _ := w.result()
		if !testenv.Poll(30*time.Second, func() bool { n, _ := w.result(); return n >= before+2 || stream.failed() }) {
			t.Fatalf("failover %d: no pod bound within 30 s of the last one", k)
		}
		if err := stream.err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		sig, how := syscall.SIGKILL, "killed"
		if k%2 == 1 {
			sig, how = syscall.SIGTERM, "stopped"
		}
		old, next := replicas[leader], replicas[1-leader]
		// The clock starts when the leader is gone: a stopped one first lets
		// its binds in flight finish (a gang member's up to -gang-bind-timeout).
		drain := time.Now()
		old.stop(sig)
		start := time.Now()
		if !testenv.Poll(failoverBudget, func() bool { code, _ := next.probe(ctx, "/readyz"); return code == http.StatusOK }) {
			_, body := next.probe(ctx, "/readyz")
			t.Fatalf("failover %d (%s leader %s): %s not leading after %v: %s", k, how, old.id, next.id, failoverBudget, body)
		}
		took := time.Since(start)
		worst = max(worst, took)
		if st := next.status(t, ctx); !st.Leading || !strings.HasPrefix(st.Leader, next.id+"-") {
			t.Fatalf("failover %d: new leader's status leading=%v leader=%q", k, st.Leading, st.Leader)
		}
		t.Logf("failover %d: leader %s %s (gone after %v), %s serving %v later", k, old.id, how,
			start.Sub(drain).Round(time.Millisecond), next.id, took.Round(time.Millisecond))
		if next.id == "b" { // its barrier is on its pod, written by this takeover
			p, err := cp.Client().CoreV1().Pods(failoverNS).Get(ctx, barrierPod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			self := fmt.Sprintf("%s-%d", next.id, next.starts)
			if v := p.Annotations[extender.AnnotationCatchUp]; !strings.HasPrefix(v, self+" ") {
				t.Fatalf("failover %d: barrier annotation %q, want one written by %s", k, v, self)
			}
		}
		old.start(t, ctx) // a fresh standby in its place
		leader = 1 - leader
	}
	binds, held := finishStream(t, c, ns, w, stream, replicas[leader], live, fmt.Sprintf("%d failovers", failovers))
	t.Logf("%d pods bound (%d gangs created) across %d failovers, the slowest %v; %d device bookings live at the end",
		binds, stream.gangs.Load(), failovers, worst.Round(time.Millisecond), held)
}

// failoverStream creates a GPU pod every 100 ms (whole GPUs and shares; every
// fifth a gang of two whole-GPU members, Koordinator's annotations), never more
// than live at once: before it creates a pod or a gang, it deletes the oldest
// ones, once bound, until the new ones fit, and waits while the oldest is
// not bound yet.
type failoverStream struct {
	quit  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	names []string
	e     error
	gangs atomic.Int64
}

// finishStream stops the stream, waits for its live pods to bind, and checks the
// whole run (what: "10 failovers"): no device double-booked or invalid, leader's
// index agreeing with the pods' device annotations, at most the stream's bookings
// left. It returns the binds seen and the bookings live at the end.
func finishStream(t *testing.T, c *cluster, ns string, w *deviceWatch, stream *failoverStream, leader *haReplica,
	live int, what string) (binds, held int) {
	t.Helper()
	stream.stop()
	if err := stream.err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	c.waitBound(t, ns, stream.alive()...)
	binds, violations := w.result()
	if len(violations) > 0 {
		t.Errorf("devices double-booked or invalid across %s:\n%s", what, strings.Join(violations, "\n"))
	}
	held = checkDevicesAgree(t, c.ctx, c.cp.Client(), ns, func() extender.Status { return leader.status(t, c.ctx) })
	checkStreamBookings(t, held, live)
	return binds, held
}

// startStreamOnSixNodes creates namespace ns with six 4-GPU nodes, watches their
// devices and starts the failover stream of live pods there (stopped at cleanup).
func startStreamOnSixNodes(t *testing.T, c *cluster, ns string, live int) (*deviceWatch, *failoverStream) {
	t.Helper()
	if err := c.cp.CreateNamespace(c.ctx, ns); err != nil {
		t.Fatal(err)
	}
	specs := make([]nodeSpec, 6)
	gpus := map[string]int{}
	for i := range specs {
		specs[i] = nodeSpec{4, modelA100}
	}
	for _, n := range c.nodes(t, ns, specs...) {
		gpus[n] = 4
	}
	w := watchDevices(t, c, ns, gpus)
	stream := startFailoverStream(c, ns, live)
	t.Cleanup(stream.stop)
	return w, stream
}

func startFailoverStream(c *cluster, ns string, live int) *failoverStream {
	s := &failoverStream{quit: make(chan struct{}), done: make(chan struct{})}
	shapes := []podSpec{{gpus: 1}, {milli: 500}, {gpus: 2}, {milli: 300}, {milli: 700}}
	go func() {
		defer close(s.done)
		client := c.cp.Client().CoreV1().Pods(ns)
		for i := 0; ; i++ {
			select {
			case <-s.quit:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var specs []podSpec
			if i%5 == 4 {
				g := fmt.Sprintf("g-%03d", i)
				for m := range 2 {
					specs = append(specs, podSpec{name: fmt.Sprintf("%s-%d", g, m), gpus: 1, annotations: map[string]string{
						contract.AnnotationKoordinatorName: g, contract.AnnotationKoordinatorMinAvailable: "2"}})
				}
			} else {
				sp := shapes[i%len(shapes)]
				sp.name = fmt.Sprintf("s-%03d", i)
				specs = append(specs, sp)
			}
			room, err := s.makeRoom(c.ctx, client, live-len(specs))
			if err != nil {
				s.fail(err)
				return
			}
			if !room {
				continue // the oldest is not bound yet: wait
			}
			if len(specs) == 2 {
				s.gangs.Add(1)
			}
			for _, sp := range specs {
				if _, err := client.Create(c.ctx, newPod(ns, sp), metav1.CreateOptions{}); err != nil {
					s.fail(err)
					return
				}
				s.mu.Lock()
				s.names = append(s.names, sp.name)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// makeRoom deletes the stream's oldest pods (grace 0: the fake nodes have no
// kubelet to finish a graceful delete) until at most keep are alive; false,
// with fewer deleted than needed, when the oldest one is not bound yet.
func (s *failoverStream) makeRoom(ctx context.Context, client typedcorev1.PodInterface, keep int) (bool, error) {
	zero := int64(0)
	for {
		s.mu.Lock()
		alive := len(s.names)
		oldest := ""
		if alive > 0 {
			oldest = s.names[0]
		}
		s.mu.Unlock()
		if alive <= keep {
			return true, nil
		}
		p, err := client.Get(ctx, oldest, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Spec.NodeName == "" {
			return false, nil
		}
		if err := client.Delete(ctx, oldest, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			return false, err
		}
		s.mu.Lock()
		s.names = s.names[1:]
		s.mu.Unlock()
	}
}

func (s *failoverStream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.e = err
}

func (s *failoverStream) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e
}

func (s *failoverStream) failed() bool { return s.err() != nil }

// stop ends the stream and waits for it (idempotent).
func (s *failoverStream) stop() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
}

// checkStreamBookings fails the test when held, the device bookings of the
// stream's namespace left in the API, exceed what live pods of at most two
// GPUs each can hold: the stream kept pods it should have deleted.
func checkStreamBookings(t *testing.T, held, live int) {
	t.Helper()
	if held > 2*live {
		t.Errorf("%d device bookings live at the end; %d pods of at most 2 GPUs each hold at most %d", held, live, 2*live)
	}
}

func (s *failoverStream) alive() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.names...)
}
