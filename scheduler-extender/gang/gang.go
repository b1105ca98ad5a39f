package gang

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

// Gang dialects.
const (
	DialectPodGroup    = "podgroup"
	DialectVolcano     = "volcano"
	DialectKoordinator = "koordinator"
)

// Gang states reported in /status and metrics.
const (
	GangWaiting       = "waiting"
	GangPlanned       = "planned"
	GangBinding       = "binding"
	GangAdmitted      = "admitted"
	GangUnschedulable = "unschedulable"
	GangInvalid       = "invalid"
)

// ErrInvalidGang means a pod's gang annotations or its PodGroup are malformed.
var ErrInvalidGang = errors.New("invalid gang spec")

// errGangBind is the base of every error a gang member's bind returns.
var errGangBind = errors.New("gang bind failed")

// gangRef is what a pod says about its gang.
type gangRef struct {
	key, namespace, name, dialect string
	min                           int   // from the pod's annotation (volcano, koordinator); 0 if absent
	err                           error // malformed annotation
}

// podGang reports the gang a pod belongs to, if any. The scheduler-plugins label
// wins over Volcano, Volcano over Koordinator.
func podGang(pod *corev1.Pod) (gangRef, bool) {
	ref := gangRef{namespace: pod.Namespace}
	minKey := ""
	switch {
	case pod.Labels[contract.LabelPodGroup] != "":
		ref.name, ref.dialect = pod.Labels[contract.LabelPodGroup], DialectPodGroup
	case pod.Annotations[contract.AnnotationVolcanoGroupName] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[contract.AnnotationVolcanoGroupName], DialectVolcano, contract.AnnotationVolcanoMinMember
	case pod.Annotations[contract.AnnotationVolcanoGroupNameAlt] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[contract.AnnotationVolcanoGroupNameAlt], DialectVolcano, contract.AnnotationVolcanoMinMember
	case pod.Annotations[contract.AnnotationKoordinatorName] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[contract.AnnotationKoordinatorName], DialectKoordinator, contract.AnnotationKoordinatorMinAvailable
	default:
		return ref, false
	}
	ref.key = ref.namespace + "/" + ref.name
	if minKey != "" {
		v, ok := pod.Annotations[minKey]
		if !ok {
			if ref.dialect != DialectVolcano { // Volcano's minMember is its PodGroup's
				ref.err = fmt.Errorf("annotation %s missing: %w", minKey, ErrInvalidGang)
			}
		} else if m, err := ParseMinMember(v); err != nil {
			ref.err = fmt.Errorf("annotation %s: %w", minKey, err)
		} else {
			ref.min = m
		}
	}
	return ref, true
}

// ParseMinMember parses a minimum member count: a decimal integer in 1..MaxGangSize.
func ParseMinMember(s string) (int, error) {
	m, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || m < 1 || m > contract.MaxGangSize {
		return 0, fmt.Errorf("min member %q must be an integer in 1..%d: %w", s, contract.MaxGangSize, ErrInvalidGang)
	}
	return m, nil
}

// Pod is a gang member as the index tracks it (the index's pod entry): its
// identity, its request and where it stands in the index's accounting. Call
// its methods with the index lock held. The index changes a member only
// when asked (Ledger) or on its own (then it tells the gangs: PodUpdated,
// PodBound, PodReleasing, PodDeleted).
type Pod interface {
	UID() types.UID
	Namespace() string
	Name() string
	Created() time.Time
	// Request is what the pod asks of a node; RequestErr why it cannot be
	// placed (a user error), nil when it can.
	Request() placement.Request
	RequestErr() error
	// Node is the node the pod is bound to or holds capacity on ("" when none).
	Node() string
	// Holds: the pod holds capacity (reserved, planned, at bind, assumed or
	// bound); Planned: as a planned gang member; Binding: at bind; Bound:
	// bound or assumed (its Binding created).
	Holds() bool
	Planned() bool
	Binding() bool
	Bound() bool
	// Member is the gangs' part of the pod, which the index keeps for them.
	Member() *Member
}

// podKey is p's namespace/name.
func podKey(p Pod) string { return p.Namespace() + "/" + p.Name() }

// Member is the gangs' part of a pod: its gang, node constraints and
// recorded plan, as its last record said (the gangs set it: PodUpdated). The
// index keeps one in each pod entry and reads only Gang.
type Member struct {
	gang      gangRef
	hasGang   bool
	cons      *podConstraints // gang members only: selector, required affinity, tolerations
	persisted *persistedPlan  // gang members only: the plan its gang-state annotation records
}

// Gang is the key (namespace/name) of m's gang; ok false for a pod outside any.
func (m *Member) Gang() (key string, ok bool) { return m.gang.key, m.hasGang }

// Record is what a pod says about its gang (its informer record keeps it):
// the gang, and for members their node constraints and recorded plan. nil for
// a pod outside any gang. Records are never modified once made.
type Record struct {
	ref       gangRef
	cons      *podConstraints
	persisted *persistedPlan
}

// RecordOf reads pod's gang (podGang), node constraints (constraintsOf) and
// recorded plan (persistedOf); nil when pod is in no gang. Its names are
// copies; the constraints are a deep copy of the pod's, whose strings still
// share the decoded pod's memory (gang members are few).
func RecordOf(pod *corev1.Pod) *Record {
	ref, ok := podGang(pod)
	if !ok {
		return nil
	}
	ref.namespace, ref.name = strings.Clone(ref.namespace), strings.Clone(ref.name)
	r := &Record{ref: ref, cons: constraintsOf(constraintsPart(pod)), persisted: persistedOf(pod)}
	if r.persisted != nil {
		r.persisted.node = strings.Clone(r.persisted.node)
	}
	return r
}

// gang is the extender's view of one gang.
type gang struct {
	key, namespace, name, dialect string
	members                       map[types.UID]Pod
	state                         string
	reason                        string // why it waits (last filter verdict)
	min                           int    // last resolved minMember
	plan                          *gangPlan

	everGen  uint64 // capGen the ever-fits verdict was computed at (0: none)
	everMin  int
	everKey  wire.RequestKey
	everCons string // constraints key of the pod it was computed for
	everFits int

	version  uint64       // bumped on every change of a member (keys noFit)
	planning bool         // a member's filter is planning outside the lock
	noFit    planCacheKey // the inputs of the last plan that did not fit (zero: none)
	noFitN   int          // how many members fit in it
}

// gangPlan is a reserved placement for a whole gang.
type gangPlan struct {
	id      uint64
	members map[types.UID]bool // value: reached bind
	arrived int
	expires time.Time
	// recorded is when the members' plan records expire, when later than
	// expires (a resumed record clamped to the plan TTL): the book keeps the
	// id finished until then, so that the record is not resumed again.
	recorded   time.Time
	committing bool
	done       chan struct{} // closed when the plan is finished (bound, failed or expired)
	results    map[types.UID]error
	err        error // whole-plan failure
}

// recordsExpire is when the members' records of pl expire.
func (pl *gangPlan) recordsExpire() time.Time {
	if pl.recorded.After(pl.expires) {
		return pl.recorded
	}
	return pl.expires
}

// planSlot is one member's place in a plan.
type planSlot struct {
	p    Pod
	node string
	devs []int
}

// planMember is what planning reads of a member: copied under the lock, so that
// planning can run without it.
type planMember struct {
	p    Pod // identity only: never read outside the lock
	req  placement.Request
	cons *podConstraints // replaced, never modified, by gangBook.join
}

func planMembersOf(ps []Pod) []planMember {
	out := make([]planMember, len(ps))
	for i, p := range ps {
		out[i] = planMember{p: p, req: p.Request(), cons: p.Member().cons}
	}
	return out
}
