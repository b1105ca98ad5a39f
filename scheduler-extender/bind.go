package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
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
	done   bool // already bound there: nothing to do
	g      *gang
	plan   *gangPlan
	commit bool         // this call binds the whole gang
	all    []bindMember // the gang's members when commit
}

func memberOf(p *podEntry) bindMember {
	return bindMember{namespace: p.namespace, name: p.name, uid: p.uid, node: p.node,
		devices: slices.Clone(p.devices), gpu: p.req.NumGPU > 0}
}

// beginBind moves a pod to phaseBinding on args.Node: from its reservation, from
// its gang plan, or by placing it now if it has neither (e.g. after a restart).
func (s *State) beginBind(args *extenderv1.ExtenderBindingArgs) (bindJob, error) {
	s.lock()
	defer s.unlock()
	var job bindJob
	p := s.pods[args.PodUID]
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
		if p.hasGang {
			break
		}
		return job, fmt.Errorf("pod %s: a bind is already in progress", p.key())
	}
	if p.hasGang {
		if g := s.gangs.byKey[p.gang.key]; g != nil && g.plan != nil && g.plan.has(p) {
			return s.beginGangBind(g, p, args.Node)
		} else if g != nil && (g.min == 0 || g.bound() < g.min) {
			return job, fmt.Errorf("gang %s: no plan holds pod %s; it must pass filter again: %w", p.gang.key, p.key(), errGangBind)
		}
	}
	if !(p.charged && p.node == args.Node && p.phase == phaseReserved) {
		e := s.nodes[args.Node]
		if e == nil {
			return job, fmt.Errorf("node %s unknown to the extender", args.Node)
		}
		s.release(p)
		if err := e.n.Fit(p.req); err != nil {
			return job, fmt.Errorf("pod %s does not fit now: %w", p.key(), err)
		}
		_, devs, ok := s.policy.Score(e.n, p.req)
		if !ok {
			return job, fmt.Errorf("pod %s: no device placement on node %s", p.key(), args.Node)
		}
		if err := s.reserve(p, e, devs, phaseBinding); err != nil {
			return job, fmt.Errorf("pod %s: %w", p.key(), err)
		}
	}
	p.phase, p.unconfirmed = phaseBinding, false
	job.member = memberOf(p)
	return job, nil
}

func (s *State) beginGangBind(g *gang, p *podEntry, node string) (bindJob, error) {
	job := bindJob{g: g, plan: g.plan}
	if p.node != node {
		return job, fmt.Errorf("gang %s: member %s is planned on %s, not %s: %w", g.key, p.key(), p.node, node, errGangBind)
	}
	if !g.plan.members[p.uid] {
		g.plan.members[p.uid] = true
		g.plan.arrived++
	}
	p.phase = phaseBinding
	job.member = memberOf(p)
	if g.plan.arrived == len(g.plan.members) && !g.plan.committing {
		g.plan.committing, g.state = true, GangBinding
		for uid := range g.plan.members {
			if m := s.pods[uid]; m != nil {
				job.all = append(job.all, memberOf(m))
			}
		}
		slices.SortFunc(job.all, func(a, b bindMember) int { return strings.Compare(a.name, b.name) })
		job.commit = true
	}
	return job, nil
}

// finishBind records the outcome of a single pod's bind.
func (s *State) finishBind(m bindMember, err error) {
	s.lock()
	defer s.unlock()
	p := s.pods[m.uid]
	if p == nil || p.phase != phaseBinding {
		return // deleted, or the informer already showed it bound
	}
	switch {
	case errors.Is(err, ErrBindUnconfirmed):
		holdUnconfirmed(p, s.now().Add(s.cfg.AssumedTTL))
	case err != nil:
		s.release(p)
	default:
		p.phase = phaseAssumed
	}
}

// finishGang records the outcome of a gang commit (each member's Binding
// error) and wakes every waiting member.
func (s *State) finishGang(g *gang, plan *gangPlan, results map[types.UID]error) {
	s.lock()
	defer s.unlock()
	bound, failed := 0, 0
	var any *podEntry
	for uid := range plan.members {
		p := s.pods[uid]
		err, tried := results[uid]
		if !tried {
			// Gone from the index before the commit: no Binding was attempted.
			err = fmt.Errorf("gang %s: member %s left before the commit: %w", g.key, uid, errGangBind)
			results[uid] = err
		}
		if err != nil {
			failed++
		} else {
			bound++
		}
		if p == nil {
			continue
		}
		any = p
		if p.phase != phaseBinding {
			continue
		}
		switch {
		case errors.Is(err, ErrBindUnconfirmed):
			holdUnconfirmed(p, s.now().Add(s.cfg.AssumedTTL))
		case err != nil:
			s.release(p)
		default:
			p.phase = phaseAssumed
		}
	}
	plan.results = results
	if g.plan == plan {
		g.plan = nil
	}
	s.gangs.finish(plan.id, plan.expires)
	if failed == 0 {
		g.state, g.reason = GangAdmitted, ""
		s.count("bound")
		if any != nil {
			s.emit(any, false, "GangBound", fmt.Sprintf("gang %s: %d members bound", g.key, bound))
		}
	} else {
		reason := fmt.Sprintf("gang %s: %d members bound, %d failed", g.key, bound, failed)
		g.state, g.reason = GangWaiting, reason
		s.count("bind_failed")
		if any != nil {
			s.emit(any, true, "GangBindFailed", reason)
		}
	}
	close(plan.done)
}

// gangBindTimeout fails plan if it is still waiting for members at bind.
func (s *State) gangBindTimeout(g *gang, plan *gangPlan) {
	s.lock()
	defer s.unlock()
	if g.plan == plan && !plan.committing {
		s.failPlan(g, fmt.Sprintf("bind timeout with %d/%d members at bind", plan.arrived, len(plan.members)), "bind_timeout")
	}
}

// planResult is a member's outcome once plan.done is closed.
func (s *State) planResult(plan *gangPlan, uid types.UID) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if plan.err != nil {
		return plan.err
	}
	return plan.results[uid]
}

// maxParallelAPI bounds concurrent API calls of one gang commit.
const maxParallelAPI = 8

// Bind places a pod on args.Node with one API write: a Binding whose metadata
// carries the pod's devices annotation, which kube-apiserver copies onto the
// pod in the same update that sets spec.nodeName (see clientAPI.BindPod). A
// gang member waits (up to GangBindTimeout) until every member of its plan has
// reached bind; the last one to arrive binds them all.
func (s *Server) Bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error {
	if err := s.state.staleForBind(); err != nil {
		return err
	}
	job, err := s.state.beginBind(&args)
	if errors.Is(err, ErrUnknownPod) {
		actx, cancel := context.WithTimeout(ctx, s.cfg.APITimeout)
		pod, gerr := s.api.GetPod(actx, args.PodNamespace, args.PodName)
		cancel()
		if gerr != nil {
			return fmt.Errorf("pod unknown and fetching it failed: %w", errors.Join(err, gerr))
		}
		if pod.UID != args.PodUID {
			return fmt.Errorf("pod %s/%s now has uid %s, not %s: %w", args.PodNamespace, args.PodName, pod.UID, args.PodUID, ErrUnknownPod)
		}
		s.state.UpsertPod(pod)
		job, err = s.state.beginBind(&args)
	}
	defer s.flush()
	if err != nil {
		return err
	}
	if job.done {
		return nil
	}
	if job.plan == nil {
		err := s.apply(ctx, []bindMember{job.member})[job.member.uid]
		s.state.finishBind(job.member, err)
		return err
	}
	if job.commit {
		s.state.finishGang(job.g, job.plan, s.apply(ctx, job.all))
	}
	timer := time.NewTimer(s.cfg.GangBindTimeout)
	defer timer.Stop()
	select {
	case <-job.plan.done:
	case <-timer.C:
		s.state.gangBindTimeout(job.g, job.plan)
		<-job.plan.done
	case <-ctx.Done():
		s.state.gangBindTimeout(job.g, job.plan)
		<-job.plan.done
	}
	return s.state.planResult(job.plan, job.member.uid)
}

// bindAnnotations is what a member's Binding writes onto the pod.
func bindAnnotations(m bindMember) map[string]string {
	if !m.gpu {
		return nil
	}
	return map[string]string{AnnotationGPUDevices: FormatDevices(m.devices)}
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
// a late one) but each is bounded by APITimeout.
func (s *Server) apply(ctx context.Context, ms []bindMember) map[types.UID]error {
	ctx = context.WithoutCancel(ctx)
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
			actx, cancel := context.WithTimeout(ctx, s.cfg.APITimeout)
			defer cancel()
			err := s.api.BindPod(actx, m.namespace, m.name, m.uid, m.node, bindAnnotations(m))
			if err != nil {
				err = s.confirmBinding(ctx, m, err)
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
	s.countBinds(ok, len(ms)-ok)
	return per
}

// confirmBinding reads the pod back after its Binding failed: kube-apiserver
// may have applied a Binding whose answer was lost (a timeout, a dropped
// connection), and freeing its devices then would book them twice. nil: the
// pod is bound to m.node after all. The Binding's error: it is not (or it is
// another pod now). ErrBindUnconfirmed: the pod could not be read either.
func (s *Server) confirmBinding(ctx context.Context, m bindMember, bindErr error) error {
	actx, cancel := context.WithTimeout(ctx, s.cfg.APITimeout)
	defer cancel()
	pod, err := s.api.GetPod(actx, m.namespace, m.name)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w (reading the pod back: %w)", ErrBindUnconfirmed, bindErr, err)
	case pod.UID == m.uid && pod.Spec.NodeName == m.node:
		s.log.Warn("binding failed but the pod is bound: its answer was lost",
			"pod", m.namespace+"/"+m.name, "node", m.node, "err", bindErr)
		return nil
	}
	return bindErr
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

func (s *Server) countBinds(ok, failed int) {
	s.met.Binds.WithLabelValues("bound").Add(float64(ok))
	s.met.Binds.WithLabelValues("error").Add(float64(failed))
}
