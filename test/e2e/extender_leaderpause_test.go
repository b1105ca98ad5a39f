package e2e_test

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/testenv"
)

// pause stops the process (SIGSTOP: it keeps its sockets and its state, and
// runs on from where it was at SIGCONT, as after a long GC pause or a frozen
// VM) and returns the channel closed when it exits and a function that
// resumes it.
func (e *extenderProcess) pause(t *testing.T) (exited <-chan struct{}, resume func()) {
	t.Helper()
	e.mu.Lock()
	cmd, done := e.cmd, e.done
	e.mu.Unlock()
	if cmd == nil {
		t.Fatalf("%s is not running", e.name)
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("pausing %s: %v", e.name, err)
	}
	return done, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT) }
}

// TestLeaderPausesNoDoubleBooking runs two replicas of cmd/scheduler-extender
// with leader election against a real kube-apiserver and kube-scheduler
// (kube-scheduler reaching the leader through the EndpointSlice it writes),
// under a stream of GPU pods (whole GPUs and shares) and two-member gangs. The
// leader is paused 10 times (SIGSTOP) until its lease has expired and the
// standby leads, and is then resumed (SIGCONT) with whatever it had in
// flight: requests kube-scheduler sent it before the pause, binds of
// gangs waiting for their last member. The resumed replica must start no
// Binding and serve nothing (its lease is gone: leadership.mayBind) and exit; a fresh standby
// takes its place. No GPU device is ever booked beyond 1000 milli by the pods
// bound at any moment, as the API shows them, and the last leader's index
// agrees with the pods' devices annotations.
func TestLeaderPausesNoDoubleBooking(t *testing.T) {
	ctx, cp, bin := controlPlaneAndExtenderBinary(t, 4*time.Minute)
	replicas, c := startHAExtenders(t, ctx, cp, bin, "")

	const (
		ns     = "e2e-leaderpause"
		pauses = 10
		live   = 8 // pods alive at once (a gang counts its members): at most 16 GPUs of 24
	)
	w, stream := startStreamOnSixNodes(t, c, ns, live)

	leader := 0
	for k := range pauses {
		before, _ := w.result()
		if !testenv.Poll(90*time.Second, func() bool { n, _ := w.result(); return n >= before+2 || stream.failed() }) {
			b, _ := replicas[leader].get(ctx, "/status")
			pods, _ := cp.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			var pend []string
			for _, p := range pods.Items {
				if p.Spec.NodeName == "" {
					msg := ""
					for _, c := range p.Status.Conditions {
						msg += c.Reason + ":" + c.Message + " "
					}
					pend = append(pend, p.Name+" "+p.Annotations["understory.io/gang-state"]+" "+msg)
				}
			}
			t.Fatalf("pause %d: no pod bound within 90 s of the last one; pending:\n%s\nleader status: %s", k,
				strings.Join(pend, "\n"), b)
		}
		if err := stream.err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		old, next := replicas[leader], replicas[1-leader]
		exited, resume := old.pause(t)
		paused := time.Now()
		if !testenv.Poll(failoverBudget, func() bool { code, _ := next.probe(ctx, "/readyz"); return code == http.StatusOK }) {
			resume()
			_, body := next.probe(ctx, "/readyz")
			t.Fatalf("pause %d: %s not leading %v after %s was paused: %s", k, next.id, failoverBudget, old.id, body)
		}
		// Resumed once the other leads: what it had in flight (kube-scheduler's
		// calls, gang members waiting at bind) runs on against a lost lease.
		resume()
		select {
		case <-exited:
		case <-time.After(failoverBudget):
			t.Fatalf("pause %d: %s still running %v after it was resumed without its lease", k, old.id, failoverBudget)
		}
		_, violations := w.result()
		t.Logf("pause %d: %s paused %v, then exited; %s leads; %d violations so far", k, old.id,
			time.Since(paused).Round(time.Millisecond), next.id, len(violations))
		old.kill() // reaped already: forget the exited process
		old.start(t, ctx)
		leader = 1 - leader
	}
	binds, held := finishStream(t, c, ns, w, stream, replicas[leader], live, fmt.Sprintf("%d leader pauses", pauses))
	t.Logf("%d pods bound (%d gangs created) across %d leader pauses; %d device bookings live at the end",
		binds, stream.gangs.Load(), pauses, held)
}
