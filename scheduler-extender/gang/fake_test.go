package gang

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/wire"
)

// TestGangThroughTheIndexInterfaces: a gang is planned, committed and bound
// with nothing but Index, Ledger and Outbox (the fake index): the first
// member's filter plans both members and passes its own node only, the other
// member's filter follows the plan, and the last member at bind commits the
// plan for both, which the ledger then holds as bound.
func TestGangThroughTheIndexInterfaces(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ix := newFakeIndex(Config{MaxMembers: 10, PlanTTL: time.Minute, BindTimeout: 20 * time.Second}, func() time.Time { return now })
	ix.addNode(testNode("n0", "A100", 1, 16, 64))
	ix.addNode(testNode("n1", "A100", 1, 16, 64))
	a := ix.addPod(podtest.Pod("ns", "a", append(podtest.Volcano("g", 2), podtest.GPUs(1), podtest.Created(0))...), "", nil)
	b := ix.addPod(podtest.Pod("ns", "b", append(podtest.Volcano("g", 2), podtest.GPUs(1), podtest.Created(1))...), "", nil)
	names := [][]byte{[]byte("n0"), []byte("n1")}

	ix.Lock()
	out, done := ix.gs.Filter(a, names, wire.Outcome{})
	ix.Unlock()
	if !done || len(out.Passed) != 1 || !a.Planned() || !b.Planned() || a.Node() == b.Node() {
		t.Fatalf("a's filter: passed %v (done %v); a %s on %q, b %s on %q", out.Passed, done, phaseName(a), a.Node(),
			phaseName(b), b.Node())
	}
	if out.Passed[0] != a.Node() {
		t.Fatalf("a's filter passed %s, its plan puts it on %s", out.Passed[0], a.Node())
	}
	ix.Lock()
	out, _ = ix.gs.Filter(b, names, wire.Outcome{})
	ix.Unlock()
	if len(out.Passed) != 1 || out.Passed[0] != b.Node() {
		t.Fatalf("b's filter passed %v, its plan puts it on %s", out.Passed, b.Node())
	}

	binds := NewBinds(ix.gs)
	ix.Lock()
	ba, err, isGang := binds.BeginBind(a, a.Node())
	a.phase = fakeBinding
	bb, errB, _ := binds.BeginBind(b, b.Node())
	b.phase = fakeBinding
	ix.Unlock()
	if err != nil || errB != nil || !isGang || ba.Commit || !bb.Commit {
		t.Fatalf("binds: a %+v %v (gang %v), b %+v %v", ba, err, isGang, bb, errB)
	}
	if got := []string{bb.All[0].Name(), bb.All[1].Name()}; !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("the commit binds %v, want a and b", got)
	}
	binds.FinishBind(bb, map[types.UID]error{a.uid: nil, b.uid: nil})
	<-ba.Done()
	if err := binds.Result(ba, a.uid); err != nil || !a.Bound() || !b.Bound() {
		t.Fatalf("after the commit: a %v %s, b %s", err, phaseName(a), phaseName(b))
	}
	if st := ix.gs.Status(); len(st) != 1 || st[0].State != GangAdmitted || st[0].Bound != 2 {
		t.Fatalf("gang status %+v", st)
	}
}

func phaseName(p *fakePod) string {
	return [...]string{"pending", "planned", "binding", "bound"}[p.phase]
}
