package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/wire"
)

// ErrNoClient means the extender runs without an API client (tests, benchmarks) and cannot bind.
var ErrNoClient = errors.New("no kubernetes client")

// ErrBindUnconfirmed means a Binding failed and reading the pod back failed too:
// the Binding may have been applied (its answer lost), so the pod's devices stay
// held until the informer shows the truth or Config.AssumedTTL passes.
var ErrBindUnconfirmed = errors.New("binding outcome unknown")

// podAPI is what the extender asks of the API server about pods.
type podAPI interface {
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// PatchPodAnnotation sets one annotation; uid guards against a recreated pod.
	PatchPodAnnotation(ctx context.Context, namespace, name string, uid types.UID, key, value string) error
	// BindPod creates the pods/binding subresource; uid guards against a
	// recreated pod. The API server sets spec.nodeName and merges annotations
	// into the pod's in the same write (see clientAPI.BindPod).
	BindPod(ctx context.Context, namespace, name string, uid types.UID, node string, annotations map[string]string) error
}

// clientAPI implements podAPI with a clientset.
type clientAPI struct{ c kubernetes.Interface }

var _ podAPI = clientAPI{}

func (a clientAPI) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p, err := a.c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, err)
	}
	return p, nil
}

func (a clientAPI) PatchPodAnnotation(ctx context.Context, namespace, name string, uid types.UID, key, value string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": uid, "annotations": map[string]string{key: value}}})
	if err != nil {
		return fmt.Errorf("encoding patch: %w", err)
	}
	if _, err := a.c.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching pod %s/%s annotation %s: %w", namespace, name, key, err)
	}
	return nil
}

// BindPod creates the Binding with annotations in its metadata. kube-apiserver
// (pkg/registry/core/pod/storage, BindingREST.Create → assignPod →
// setPodNodeAndMetadata in 1.34; setPodHostAndAnnotations in older releases)
// applies a Binding in one GuaranteedUpdate of the pod: it checks the UID
// precondition, refuses a pod already assigned or being deleted, sets
// spec.nodeName, copies every key of the Binding's metadata.annotations onto
// the pod's annotations and sets PodScheduled=True. So the annotations and the
// node land in one etcd write and one watch event: nobody can see the pod bound
// without them, and a failed Binding leaves none behind.
func (a clientAPI) BindPod(ctx context.Context, namespace, name string, uid types.UID, node string, annotations map[string]string) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid, Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if err := a.c.CoreV1().Pods(namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("binding pod %s/%s to %s: %w", namespace, name, node, err)
	}
	return nil
}

// noAPI is the podAPI of an extender without a client.
type noAPI struct{}

func (noAPI) GetPod(context.Context, string, string) (*corev1.Pod, error) { return nil, ErrNoClient }
func (noAPI) PatchPodAnnotation(context.Context, string, string, types.UID, string, string) error {
	return ErrNoClient
}
func (noAPI) BindPod(context.Context, string, string, types.UID, string, map[string]string) error {
	return ErrNoClient
}

// bindMember is one pod to bind: one Binding carrying its devices annotation.
type bindMember struct {
	namespace, name string
	uid             types.UID
	node            string
	devices         []int
	gpu             bool
}

// bindJob is what beginBind decided.
type bindJob struct {
	member bindMember
	done   bool         // already bound there: nothing to do
	gang   *gang.Bind   // a planned gang member's bind (nil: a pod alone)
	all    []bindMember // the gang's members when gang.Commit: this call binds them all
}

func memberOf(p *podEntry) bindMember {
	return bindMember{namespace: p.namespace, name: p.name, uid: p.uid, node: p.node,
		devices: slices.Clone(p.devices), gpu: p.req.NumGPU > 0}
}

// maxParallelAPI bounds concurrent API calls of one gang commit.
const maxParallelAPI = 8

// binder binds pods: it asks the reservations (and through them gang.Binds)
// to move a pod to binding, creates the Bindings (apply), reads a pod back
// when a Binding's answer may have been lost (confirmBinding) and records the
// outcome. It refuses binds while the node or pod informer is stale, and
// starts no Binding once this replica's leadership has ended (lead). It takes
// no lock of its own: the reservations and gang.Binds take the index's.
type binder struct {
	cfg     Config
	api     podAPI
	contact *apiContact
	ix      *State // a pod unknown to the index is fetched and recorded (UpsertPod)
	res     *reservations
	binds   *gang.Binds
	out     *outbox
	met     *metrics.Extender
	log     *slog.Logger
	lead    *leadership // nil without leader election: always leading
}

// Bind places a pod on args.Node with one API write: a Binding whose metadata
// carries the pod's devices annotation, which kube-apiserver copies onto the
// pod in the same update that sets spec.nodeName (see clientAPI.BindPod). A
// gang member waits (up to GangBindTimeout) until every member of its plan has
// reached bind; the last one to arrive binds them all.
func (b *binder) Bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error {
	if err := b.contact.staleForBind(b.cfg.MaxCacheStaleness); err != nil {
		return err
	}
	job, err := b.res.beginBind(&args)
	if errors.Is(err, ErrUnknownPod) {
		actx, cancel := context.WithTimeout(ctx, b.cfg.APITimeout)
		pod, gerr := b.api.GetPod(actx, args.PodNamespace, args.PodName)
		cancel()
		if gerr != nil {
			return fmt.Errorf("pod unknown and fetching it failed: %w", errors.Join(err, gerr))
		}
		if pod.UID != args.PodUID {
			return fmt.Errorf("pod %s/%s now has uid %s, not %s: %w", args.PodNamespace, args.PodName, pod.UID, args.PodUID, ErrUnknownPod)
		}
		b.ix.UpsertPod(pod)
		job, err = b.res.beginBind(&args)
	}
	defer b.out.flush()
	if err != nil {
		return err
	}
	if job.done {
		return nil
	}
	if job.gang == nil {
		err := b.apply(ctx, []bindMember{job.member})[job.member.uid]
		b.res.finishBind(job.member, err)
		return err
	}
	if job.gang.Commit {
		b.binds.FinishBind(job.gang, b.apply(ctx, job.all))
	}
	timer := time.NewTimer(b.cfg.GangBindTimeout)
	defer timer.Stop()
	select {
	case <-job.gang.Done():
	case <-timer.C:
		b.binds.BindTimeout(job.gang)
		<-job.gang.Done()
	case <-ctx.Done():
		b.binds.BindTimeout(job.gang)
		<-job.gang.Done()
	}
	return b.binds.Result(job.gang, job.member.uid)
}

// bindAnnotations is what a member's Binding writes onto the pod.
func bindAnnotations(m bindMember) map[string]string {
	if !m.gpu {
		return nil
	}
	return map[string]string{contract.AnnotationGPUDevices: contract.FormatGPUDevices(m.devices)}
}

// apply creates every member's Binding (its devices annotation inside, one
// write per pod), at most maxParallelAPI at a time, and returns each member's
// error (nil: bound).
//
// A gang's members are bound the same way, without a first round of annotation
// patches: kube-apiserver cannot create several Bindings atomically, so a gang
// commit was never all-or-nothing at the API (a Binding cannot be undone). The
// patch round only moved a member deleted or recreated since its plan from
// "its Binding fails" to "no Binding is created", at the price of a second
// write per member inside the gang's bind wait. Such a member now fails alone
// on the Binding's UID precondition, the others are bound, and the gang needs
// only the missing members again (as for any partial failure). A member
// deleted before the commit has released the plan already.
//
// API calls outlive a cancelled request (a half-done gang commit is worse than
// a late one) but not this replica's leadership: they run under the lease's
// context (leadership.bindContext), which ends when the lease is lost, and
// each is bounded by APITimeout. No Binding starts unless leadership.mayBind
// allows it right before: a member whose Binding did not start fails with an
// error wrapping ErrLeadershipLost (or ErrStandby), and its devices are freed
// (nothing was written). A standby may lead soon after the loss; a Binding
// sent by the old leader then could book devices the new one gives away.
func (b *binder) apply(ctx context.Context, ms []bindMember) map[types.UID]error {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	lease := b.lead.bindContext()
	defer context.AfterFunc(lease, func() { cancel(context.Cause(lease)) })()
	per := make(map[types.UID]error, len(ms))
	var mu sync.Mutex
	sem := make(chan struct{}, maxParallelAPI)
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := b.lead.mayBind()
			if err == nil {
				err = context.Cause(ctx) // the lease's context ended
			}
			if err != nil {
				err = fmt.Errorf("binding pod %s/%s to %s not started: %w", m.namespace, m.name, m.node, err)
			} else {
				actx, cancel := context.WithTimeout(ctx, b.cfg.APITimeout)
				err = b.api.BindPod(actx, m.namespace, m.name, m.uid, m.node, bindAnnotations(m))
				cancel()
				if err != nil {
					err = b.confirmBinding(ctx, m, err)
				}
			}
			mu.Lock()
			per[m.uid] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	ok := 0
	for _, m := range ms {
		if per[m.uid] == nil {
			ok++
		}
	}
	b.countBinds(ok, len(ms)-ok)
	return per
}

// confirmBinding reads the pod back after its Binding failed: kube-apiserver
// may have applied a Binding whose answer was lost (a timeout, a dropped
// connection), and freeing its devices then would book them twice. nil: the
// pod is bound to m.node after all. The Binding's error: it is not (or it is
// another pod now). ErrBindUnconfirmed: the pod could not be read either.
func (b *binder) confirmBinding(ctx context.Context, m bindMember, bindErr error) error {
	actx, cancel := context.WithTimeout(ctx, b.cfg.APITimeout)
	defer cancel()
	pod, err := b.api.GetPod(actx, m.namespace, m.name)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w (reading the pod back: %w)", ErrBindUnconfirmed, bindErr, err)
	case pod.UID == m.uid && pod.Spec.NodeName == m.node:
		b.log.Warn("binding failed but the pod is bound: its answer was lost",
			"pod", m.namespace+"/"+m.name, "node", m.node, "err", bindErr)
		return nil
	}
	return bindErr
}

func (b *binder) countBinds(ok, failed int) {
	b.met.Binds.WithLabelValues("bound").Add(float64(ok))
	b.met.Binds.WithLabelValues("error").Add(float64(failed))
}

// refuseBind answers a bind call with err, in ExtenderBindingResult's error field.
func refuseBind(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, wire.BindingResult(err.Error()))
}

func (s *Server) handleBind(w http.ResponseWriter, r *http.Request) {
	buf, code, err := s.readBody(w, r)
	if err != nil {
		refuseBind(w, code, err)
		return
	}
	args, err := wire.BindingArgs(buf.Bytes())
	s.release(buf)
	if err != nil {
		refuseBind(w, http.StatusBadRequest, err)
		return
	}
	if err := s.Bind(r.Context(), args); err != nil {
		code := http.StatusOK // the protocol reports bind failures in the result
		if errors.Is(err, ErrCacheStale) {
			code = http.StatusServiceUnavailable
		}
		refuseBind(w, code, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.BindingResult(""))
}

// beginBind moves a pod to phaseBinding on args.Node: from its reservation, from
// its gang plan (gang.Binds.BeginBind), or by placing it now if it has neither
// (e.g. after a restart).
func (r *reservations) beginBind(args *extenderv1.ExtenderBindingArgs) (bindJob, error) {
	ix := r.ix
	ix.lock()
	defer ix.unlock()
	var job bindJob
	p := ix.pod(args.PodUID)
	if p == nil {
		return job, fmt.Errorf("pod %s/%s (uid %s): %w", args.PodNamespace, args.PodName, args.PodUID, ErrUnknownPod)
	}
	if p.namespace != args.PodNamespace || p.name != args.PodName {
		return job, fmt.Errorf("uid %s belongs to %s, not %s/%s: %w", args.PodUID, p.key(), args.PodNamespace, args.PodName, ErrUnknownPod)
	}
	if p.reqErr != nil {
		return job, fmt.Errorf("pod %s: %w", p.key(), p.reqErr)
	}
	switch p.phase {
	case phaseAssumed, phaseBound:
		if p.node == args.Node {
			job.done = true
			return job, nil
		}
		return job, fmt.Errorf("pod %s is already bound to %s", p.key(), p.node)
	case phaseBinding:
		if p.inGang() {
			break
		}
		return job, fmt.Errorf("pod %s: a bind is already in progress", p.key())
	}
	if p.inGang() {
		if b, err, isGang := r.binds.BeginBind(p, args.Node); isGang {
			if err != nil {
				return job, err
			}
			p.phase = phaseBinding
			job.member, job.gang = memberOf(p), b
			for _, m := range b.All {
				job.all = append(job.all, memberOf(m.(*podEntry)))
			}
			return job, nil
		}
	}
	// A reservation on a GPU that has since gone unhealthy (or off the agent's
	// list) is placed again: the bind must not book a share on a broken GPU.
	if !(p.charged && p.node == args.Node && p.phase == phaseReserved) || r.led.onUnavailableGPU(p) {
		e := r.led.node(args.Node)
		if e == nil {
			return job, fmt.Errorf("node %s unknown to the extender", args.Node)
		}
		r.led.release(p)
		if err := e.n.Fit(p.req); err != nil {
			return job, fmt.Errorf("pod %s does not fit now: %w", p.key(), err)
		}
		_, devs, ok := r.sc.servingPolicy().Score(e.n, p.req)
		if !ok {
			return job, fmt.Errorf("pod %s: no device placement on node %s", p.key(), args.Node)
		}
		if err := r.led.place(p, e, devs, phaseBinding); err != nil {
			return job, fmt.Errorf("pod %s: %w", p.key(), err)
		}
	}
	p.phase, p.unconfirmed = phaseBinding, false
	job.member = memberOf(p)
	return job, nil
}

// finishBind records the outcome of a single pod's bind.
func (r *reservations) finishBind(m bindMember, err error) {
	r.ix.lock()
	defer r.ix.unlock()
	p := r.ix.pod(m.uid)
	if p == nil || p.phase != phaseBinding {
		return // deleted, or the informer already showed it bound
	}
	r.settle(p, err)
}

// settle records the outcome err of p's Binding (p in phaseBinding): assumed,
// released, or held unconfirmed. Call with the index lock held for writing.
// A gang commit settles each member so too (gangPort.Settle).
func (r *reservations) settle(p *podEntry, err error) {
	switch {
	case errors.Is(err, ErrBindUnconfirmed):
		holdUnconfirmed(p, r.now().Add(r.cfg.AssumedTTL))
	case err != nil:
		r.led.release(p)
	default:
		p.phase = phaseAssumed
	}
}

// holdUnconfirmed keeps p's capacity after a Binding whose outcome is unknown:
// as a reservation until expires (now + AssumedTTL), so it ends when the
// informer shows the pod bound (then it is bound) or not (then it expires).
// A filter of the pod meanwhile (kube-scheduler retries a failed bind) keeps
// the hold and passes its node only: releasing it could hand devices the
// API server has already given the pod to another pod. Call with the index
// lock held.
func holdUnconfirmed(p *podEntry, expires time.Time) {
	p.phase, p.expires, p.unconfirmed = phaseReserved, expires, true
}
