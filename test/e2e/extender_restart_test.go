package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/testenv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/understory/understory/internal/controlplane"
	extender "github.com/understory/understory/scheduler-extender"
)

// extenderProcess is cmd/scheduler-extender run as a process of its own on a
// fixed address, so that it can be killed (SIGKILL: no shutdown, no binds
// finished) or stopped and started again where kube-scheduler expects it.
type extenderProcess struct {
	name, bin, addr, kubeconfig, log string
	// args are the flags after -listen and -kubeconfig for the n-th start (1, 2,
	// ...); env is added to the process' environment; start waits until
	// readyPath answers 200.
	args      func(n int) []string
	env       []string
	readyPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

// buildExtender builds cmd/scheduler-extender into out.
// controlPlaneAndExtenderBinary starts a control plane (startControlPlane: a
// parallel test, skipped in -short mode) while cmd/scheduler-extender builds, and
// returns the test's context, the control plane and the binary.
func controlPlaneAndExtenderBinary(t *testing.T, timeout time.Duration) (context.Context,
	*controlplane.ControlPlane, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real control plane; skipped in -short mode")
	}
	bin := filepath.Join(t.TempDir(), "scheduler-extender")
	built := make(chan error, 1)
	bctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	go func() { built <- buildExtender(bctx, bin) }()
	ctx, cp := startControlPlane(t, timeout)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	return ctx, cp, bin
}

func buildExtender(ctx context.Context, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/scheduler-extender")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building scheduler-extender: %w\n%s", err, b)
	}
	return nil
}

func newExtenderProcess(t *testing.T, bin, kubeconfig string) *extenderProcess {
	return newExtenderProcessAt(t, "scheduler-extender", bin, kubeconfig, freeLoopbackAddr(t))
}

// newExtenderProcessAt is an extender named name (its log's name) listening on addr,
// waited for at /readyz; the caller may set args, env and readyPath before start.
func newExtenderProcessAt(t *testing.T, name, bin, kubeconfig, addr string) *extenderProcess {
	e := &extenderProcess{name: name, bin: bin, addr: addr, kubeconfig: kubeconfig,
		log: filepath.Join(t.TempDir(), name+".log"), readyPath: "/readyz"}
	t.Cleanup(func() {
		e.kill()
		if t.Failed() {
			if b, err := os.ReadFile(e.log); err == nil {
				t.Logf("%s log (%s, %d starts):\n%s", name, e.log, e.starts, controlplane.TailLines(string(b), 60))
			}
		}
	})
	return e
}

// start runs a new process (appending to the log) and waits for readyPath.
func (e *extenderProcess) start(t *testing.T, ctx context.Context) {
	t.Helper()
	f, err := os.OpenFile(e.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e.mu.Lock()
	e.starts++
	fmt.Fprintf(f, "=== start %d\n", e.starts)
	args := []string{"-listen", e.addr, "-kubeconfig", e.kubeconfig}
	if e.args != nil {
		args = append(args, e.args(e.starts)...)
	}
	cmd := exec.Command(e.bin, args...)
	cmd.Env = append(os.Environ(), e.env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.mu.Unlock()
		t.Fatalf("starting %s: %v", e.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	e.cmd, e.done = cmd, done
	e.mu.Unlock()
	testenv.WaitFor(t, 60*time.Second, e.name+" answering "+e.readyPath, func() bool {
		select {
		case <-done:
			t.Fatalf("%s exited during start-up (see %s)", e.name, e.log)
		default:
		}
		code, _ := e.probe(ctx, e.readyPath)
		return code == http.StatusOK
	})
}

// kill sends SIGKILL and waits for the process to be gone.
func (e *extenderProcess) kill() { e.stop(syscall.SIGKILL) }

// stop sends sig (SIGKILL: gone at once; SIGTERM: binds in flight finish and, with
// -leader-elect, the lease is released) and waits for the process to be gone.
func (e *extenderProcess) stop(sig syscall.Signal) {
	e.mu.Lock()
	cmd, done := e.cmd, e.done
	e.cmd = nil
	e.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	<-done
}

// probe answers GET path's status code and body (0 and the error when unreachable).
func (e *extenderProcess) probe(ctx context.Context, path string) (int, string) {
	b, err := e.get(ctx, path)
	var se statusError
	switch {
	case errors.As(err, &se):
		return se.code, string(b)
	case err != nil:
		return 0, err.Error()
	}
	return http.StatusOK, string(b)
}

// statusError is an answer other than 200.
type statusError struct {
	code   int
	status string
	path   string
}

func (s statusError) Error() string { return fmt.Sprintf("GET %s: %s", s.path, s.status) }

func (e *extenderProcess) url() string { return "http://" + e.addr }

func (e *extenderProcess) get(ctx context.Context, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url()+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, statusError{code: resp.StatusCode, status: resp.Status, path: path}
	}
	return b, nil
}

func (e *extenderProcess) status(t *testing.T, ctx context.Context) extender.Status {
	t.Helper()
	b, err := e.get(ctx, "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st extender.Status
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("decoding /status: %v", err)
	}
	return st
}

// deviceWatch follows every pod of a namespace through a watch and checks,
// at each event that shows a pod bound, that the pod's devices do not
// overlap (beyond 1000 milli a device) the devices of the pods bound at that
// moment: the watch delivers the namespace's changes in resourceVersion
// order, so its live set is exactly the API server's at each event. This
// catches a double booking even when one of the pods is deleted later.
type deviceWatch struct {
	mu         sync.Mutex
	live       map[types.UID]*corev1.Pod // bound pods now
	binds      int                       // pods seen bound (once each)
	seen       map[types.UID]bool
	violations []string
}

func watchDevices(t *testing.T, c *cluster, ns string, gpus map[string]int) *deviceWatch {
	t.Helper()
	rw := watchPodsFromNow(t, c, ns)
	w := &deviceWatch{live: map[types.UID]*corev1.Pod{}, seen: map[types.UID]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range rw.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			w.mu.Lock()
			if ev.Type == watch.Deleted || p.Spec.NodeName == "" {
				delete(w.live, p.UID)
			} else if _, was := w.live[p.UID]; !was {
				w.check(p, gpus[p.Spec.NodeName])
				w.live[p.UID] = p
				if !w.seen[p.UID] {
					w.seen[p.UID] = true
					w.binds++
				}
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		rw.Stop()
		<-done
	})
	return w
}

// check records a violation if p, newly bound, overbooks a device. Call with mu held.
func (w *deviceWatch) check(p *corev1.Pod, gpus int) {
	req, err := extender.PodRequest(p)
	if err != nil || req.NumGPU == 0 {
		return
	}
	d, err := contract.ParseGPUDevices(p.Annotations[contract.AnnotationGPUDevices])
	if err != nil || len(d) != req.NumGPU {
		w.violations = append(w.violations, fmt.Sprintf("%s bound to %s with %s=%q", p.Name, p.Spec.NodeName,
			contract.AnnotationGPUDevices, p.Annotations[contract.AnnotationGPUDevices]))
		return
	}
	for _, dev := range d {
		if dev >= gpus {
			w.violations = append(w.violations, fmt.Sprintf("%s: device %d of a %d-GPU node", p.Name, dev, gpus))
		}
		used, with := req.GPUMilli, []string{p.Name}
		for _, o := range w.live {
			if o.Spec.NodeName != p.Spec.NodeName {
				continue
			}
			oreq, err := extender.PodRequest(o)
			if err != nil {
				continue
			}
			od, _ := contract.ParseGPUDevices(o.Annotations[contract.AnnotationGPUDevices])
			for _, x := range od {
				if x == dev {
					used += oreq.GPUMilli
					with = append(with, o.Name)
				}
			}
		}
		if used > contract.MilliPerGPU {
			w.violations = append(w.violations, fmt.Sprintf("%s/%d booked for %d milli by %v", p.Spec.NodeName, dev, used, with))
		}
	}
}

func (w *deviceWatch) result() (int, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.binds, append([]string(nil), w.violations...)
}

// TestExtenderRestarts kills the extender (a process of its own, SIGKILL)
// and starts it again, on a real control plane under the real kube-scheduler:
//
//   - 10 times under a stream of GPU pods (whole GPUs and shares, bound pods
//     deleted as new ones come): no device is ever booked twice, every pod is
//     bound in the end, and the last extender's index agrees with the pods'
//     device annotations;
//   - once mid-bind of a gang (two members waiting at bind for the third):
//     the restarted extender resumes the recorded plan and binds the gang
//     whole on the recorded nodes.
func TestExtenderRestarts(t *testing.T) {
	ctx, cp, bin := controlPlaneAndExtenderBinary(t, 6*time.Minute)
	ext := newExtenderProcess(t, bin, cp.Kubeconfig())
	ext.start(t, ctx)
	manifest, err := controlplane.ReadSchedulerManifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := controlplane.ManifestSchedulerConfig(manifest, ext.url())
	if err != nil {
		t.Fatal(err)
	}
	cp.StartScheduler(t, cfg)
	c := &cluster{ctx: ctx, cp: cp}

	t.Run("10 kills under a stream of GPU pods", func(t *testing.T) { testKillsUnderStream(t, c, ext) })
	if t.Failed() {
		return
	}
	t.Run("gang restart mid-bind", func(t *testing.T) { testGangRestartMidBind(t, c, ext) })
}

func testKillsUnderStream(t *testing.T, c *cluster, ext *extenderProcess) {
	const (
		ns    = "e2e-restart"
		kills = 10
		live  = 8 // pods alive at once: at most 16 GPUs of 24
	)
	if err := c.cp.CreateNamespace(c.ctx, ns); err != nil {
		t.Fatal(err)
	}
	nodes := c.nodes(t, ns, nodeSpec{4, modelA100}, nodeSpec{4, modelA100}, nodeSpec{4, modelA100},
		nodeSpec{4, modelA100}, nodeSpec{4, modelA100}, nodeSpec{4, modelA100})
	gpus := map[string]int{}
	for _, n := range nodes {
		gpus[n] = 4
	}
	w := watchDevices(t, c, ns, gpus)
	shapes := []podSpec{{gpus: 1}, {milli: 500}, {gpus: 1}, {gpus: 2}, {milli: 300}, {milli: 700}}

	// The stream: a pod every 100 ms while fewer than live exist; once live
	// exist, the oldest bound one is deleted first.
	stop := make(chan struct{})
	streamed := make(chan []string, 1)
	streamErr := make(chan error, 1)
	go func() {
		var alive []string
		defer func() { streamed <- alive }()
		client := c.cp.Client().CoreV1().Pods(ns)
		zero := int64(0)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if len(alive) >= live {
				p, err := client.Get(c.ctx, alive[0], metav1.GetOptions{})
				if err != nil {
					streamErr <- err
					return
				}
				if p.Spec.NodeName == "" {
					continue // not bound yet: wait
				}
				if err := client.Delete(c.ctx, alive[0], metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
					streamErr <- err
					return
				}
				alive = alive[1:]
			}
			s := shapes[i%len(shapes)]
			s.name = fmt.Sprintf("s-%03d", i)
			if _, err := client.Create(c.ctx, newPod(ns, s), metav1.CreateOptions{}); err != nil {
				streamErr <- err
				return
			}
			alive = append(alive, s.name)
		}
	}()

	for k := range kills {
		// Let the new process bind some pods, then kill it mid-stream.
		before, _ := w.result()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if n, _ := w.result(); n >= before+2 {
				break
			}
			if time.Now().After(deadline) {
				close(stop)
				t.Fatalf("kill %d: no pod bound within 30s of the restart", k)
			}
			select {
			case err := <-streamErr:
				t.Fatalf("stream: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
		}
		time.Sleep(time.Duration(100+137*k%400) * time.Millisecond)
		ext.kill()
		ext.start(t, c.ctx)
	}
	close(stop)
	alive := <-streamed
	c.waitBound(t, ns, alive...)
	binds, violations := w.result()
	if len(violations) > 0 {
		t.Errorf("devices double-booked or invalid across %d restarts:\n%s", kills, strings.Join(violations, "\n"))
	}
	held := checkDevicesAgree(t, c.ctx, c.cp.Client(), ns, func() extender.Status { return ext.status(t, c.ctx) })
	t.Logf("%d pods bound across %d kills; %d device bookings live at the end", binds, kills, held)
}

func testGangRestartMidBind(t *testing.T, c *cluster, ext *extenderProcess) {
	const (
		ns        = "e2e-restart-gang"
		minMember = 3
		gate      = "understory.io/e2e-hold"
	)
	if err := c.cp.CreateNamespace(c.ctx, ns); err != nil {
		t.Fatal(err)
	}
	c.nodes(t, ns, twoNodes(2, modelA100)...)
	// Members 0 and 1 are scheduled at once; member 2 carries a scheduling
	// gate, so the plan (which counts it: it exists and is pending) holds 0
	// and 1 waiting at bind until the gate is lifted.
	var pods []*corev1.Pod
	for i := range minMember {
		p := newPod(ns, memberSpec(extender.DialectKoordinator, minMember, i, 1, 0))
		if i == minMember-1 {
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: gate}}
		}
		pods = append(pods, p)
	}
	if err := c.cp.CreatePods(c.ctx, pods); err != nil {
		t.Fatal(err)
	}
	key := ns + "/" + gangName
	gangOf := func(st extender.Status) (extender.GangStatus, bool) {
		for _, g := range st.Gangs {
			if g.Gang == key {
				return g, true
			}
		}
		return extender.GangStatus{}, false
	}
	waitGang := func(what string, ok func(extender.GangStatus) bool) extender.GangStatus {
		var last extender.GangStatus
		for {
			if g, found := gangOf(ext.status(t, c.ctx)); found {
				last = g
				if ok(g) {
					return g
				}
			}
			select {
			case <-c.ctx.Done():
				t.Fatalf("gang %s: %s; last status %+v", key, what, last)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	// The kill comes once the plan is recorded on every member: a plan killed
	// before its records land is planned anew, which is safe but not what this
	// test is about.
	before := waitGang("two members at bind, the plan recorded on all", func(g extender.GangStatus) bool {
		return g.State == extender.GangPlanned && len(g.Plan) == minMember && g.AtBind == minMember-1 &&
			g.Recorded == minMember
	})
	ext.kill()
	ext.start(t, c.ctx)
	after := waitGang("plan resumed after the restart", func(g extender.GangStatus) bool {
		return len(g.Plan) == minMember
	})
	// The record keeps the expiry in whole seconds.
	if !slicesEqual(before.Plan, after.Plan) || before.PlanExpiry.Unix() != after.PlanExpiry.Unix() {
		t.Errorf("plan before the restart %v (until %v), after %v (until %v): want it resumed as recorded",
			before.Plan, before.PlanExpiry, after.Plan, after.PlanExpiry)
	}
	if b, err := ext.get(c.ctx, "/metrics"); err != nil || sumMetric(string(b),
		"understory_extender_gang_transitions_total", `event="resumed"`) != 1 {
		t.Errorf("gang_transitions_total{event=resumed} is not 1 after the restart (%v)", err)
	}
	// Lift the gate: the third member reaches bind and the gang is bound whole.
	p, err := c.cp.Client().CoreV1().Pods(ns).Get(c.ctx, pods[minMember-1].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.SchedulingGates = nil
	if _, err := c.cp.Client().CoreV1().Pods(ns).Update(c.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	bound := c.waitBound(t, ns, names...)
	var ids []string
	for _, p := range bound {
		// planned:<id>:<node>:<devices>:<expiry>, written when the plan was made.
		parts := strings.Split(p.Annotations[contract.AnnotationGangState], ":")
		if len(parts) != 5 || parts[2] != p.Spec.NodeName {
			t.Errorf("member %s bound to %s, its recorded plan says %q", p.Name, p.Spec.NodeName,
				p.Annotations[contract.AnnotationGangState])
			continue
		}
		if d := p.Annotations[contract.AnnotationGPUDevices]; d != parts[3] {
			t.Errorf("member %s got devices %q, its recorded plan says %q", p.Name, d, parts[3])
		}
		ids = append(ids, parts[1])
	}
	for _, id := range ids {
		if id != ids[0] {
			t.Errorf("members bound under plans %v: want the one plan resumed", ids)
			break
		}
	}
	checkDevicesAgree(t, c.ctx, c.cp.Client(), ns, func() extender.Status { return ext.status(t, c.ctx) })
	waitGang("admitted", func(g extender.GangStatus) bool { return g.State == extender.GangAdmitted && g.Bound == minMember })
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
