package evict

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// Event reasons recorded on a pod.
const (
	// EventEvicted: the API server accepted the eviction.
	EventEvicted = "Evicted"
	// EventEvictionBlocked: a PodDisruptionBudget refused it (HTTP 429).
	EventEvictionBlocked = "EvictionBlocked"
	// EventEvictionFailed: any other failure, including a missing permission.
	EventEvictionFailed = "EvictionFailed"
	// EventEvictionDryRun: what would have been evicted (dry run, static mode).
	EventEvictionDryRun = "EvictionDryRun"
)

// Defaults of Options fields left zero.
const (
	DefaultRequestTimeout   = 10 * time.Second
	DefaultUnavailableRetry = 10 * time.Minute
	// evictedMemory is how long an evicted pod's UID is remembered and never
	// evicted again: its termination grace period may be long, and the pod
	// stays listed (terminating) meanwhile.
	evictedMemory = time.Hour
)

// ErrInvalidRequest is returned by Submit for a request it cannot act on.
var ErrInvalidRequest = errors.New("invalid eviction request")

// API is what the Evictor needs of the API server: POST a policy/v1 Eviction
// for the pod eviction.Namespace/eviction.Name. podsource.CoreClient
// implements it; PerNamespace adapts client-go's typed pod clients.
type API interface {
	EvictV1(ctx context.Context, eviction *policyv1.Eviction) error
}

// PerNamespace adapts a per-namespace pod client, such as
// clientset.CoreV1().Pods, to API.
type PerNamespace func(namespace string) API

// EvictV1 calls f(eviction.Namespace).EvictV1.
func (f PerNamespace) EvictV1(ctx context.Context, eviction *policyv1.Eviction) error {
	return f(eviction.Namespace).EvictV1(ctx, eviction)
}

// EventRecorder records a Warning event on a pod; podsource.EventSink and
// podsource.LogSink satisfy it. The pod passed carries only namespace, name
// and UID. Warn must not block.
type EventRecorder interface {
	Warn(pod *corev1.Pod, reason, message string)
}

var _ API = PerNamespace(nil)

// Options configures an Evictor. Zero fields take defaults.
type Options struct {
	// Escalation supplies maxEvictionsPerMinute, evictionBackoff and
	// maxEvictionBackoff (the agent's qos.EscalationConfig).
	Escalation qos.EscalationConfig
	// DryRun reports evictions without performing them (forced when the API
	// is nil: static mode).
	DryRun bool
	// RequestTimeout bounds one eviction request (DefaultRequestTimeout).
	RequestTimeout time.Duration
	// UnavailableRetry is how long evictions pause after the API refused the
	// agent (RBAC 403) or lacks the eviction API (DefaultUnavailableRetry).
	UnavailableRetry time.Duration
	// Events receives one event per action (nil: none).
	Events EventRecorder
	// Metrics counts evictions by reason and result (nil: none).
	Metrics *metrics.Escalation
	// Logger (nil discards).
	Logger *slog.Logger
	// Now replaces time.Now (tests).
	Now func() time.Time
}

// Record is one eviction attempt, as shown in Status.
type Record struct {
	Time      time.Time `json:"time"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	Reason    string    `json:"reason"`
	// Result is one of the metrics.EvictResult* values.
	Result  string `json:"result"`
	Message string `json:"message"`
}

// Blocked is a pod whose eviction was refused or failed, and is skipped
// until Until.
type Blocked struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	Result    string    `json:"result"`
	Failures  int       `json:"failures"`
	Backoff   string    `json:"backoff"`
	Until     time.Time `json:"until"`
}

// RequestStatus is the latest request and how far it got.
type RequestStatus struct {
	Submitted  time.Time `json:"submitted"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message"`
	Candidates int       `json:"candidates"`
	Evicted    int       `json:"evicted"`
	FreedBytes int64     `json:"freedBytes"`
	// Outcome is "pending", "done", "unsatisfied" (every candidate refused,
	// backed off or gone), "superseded" (a newer request replaced it) or
	// "unavailable".
	Outcome string `json:"outcome"`
}

// Status is the Evictor's state for /status.
type Status struct {
	DryRun       bool           `json:"dryRun"`
	LastRequest  *RequestStatus `json:"lastRequest,omitempty"`
	LastEviction *Record        `json:"lastEviction,omitempty"`
	LastError    *Record        `json:"lastError,omitempty"`
	// Unavailable is set while evictions pause after a 403 or a missing
	// eviction API; UnavailableUntil is when the next attempt may happen.
	Unavailable      *Record   `json:"unavailable,omitempty"`
	UnavailableUntil time.Time `json:"unavailableUntil,omitzero"`
	Blocked          []Blocked `json:"blocked,omitempty"`
}

type backoff struct {
	ns, name string
	result   string
	failures int
	delay    time.Duration
	until    time.Time
}

// request is a submitted request and its progress.
type request struct {
	req    qos.EvictionRequest
	cands  []qos.EvictionCandidate
	next   int
	status RequestStatus
}

// Evictor evicts batch pods through the Eviction API off the control loop:
// Submit never waits for the API server, Run does the work. Submit and
// Status are safe for concurrent use; Run must be called once.
type Evictor struct {
	api     API
	dryRun  bool
	timeout time.Duration
	retry   time.Duration
	base    time.Duration
	maxBack time.Duration
	events  EventRecorder
	metrics *metrics.Escalation
	log     *slog.Logger
	now     func() time.Time
	limiter *rate.Limiter
	wake    chan struct{}

	mu               sync.Mutex
	pending          *request
	last             *request
	backoff          map[types.UID]*backoff
	evicted          map[types.UID]time.Time
	lastEviction     *Record
	lastError        *Record
	unavailable      *Record
	unavailableUntil time.Time
}

// New returns an Evictor posting through api; a nil api gives a dry-run
// Evictor (static mode: no API server).
func New(api API, o Options) *Evictor {
	c := o.Escalation
	perMin := c.MaxEvictionsPerMinute
	if perMin < 1 {
		perMin = qos.DefaultMaxEvictionsPerMinute
	}
	e := &Evictor{
		api:     api,
		dryRun:  o.DryRun || api == nil,
		timeout: cmp.Or(max(o.RequestTimeout, 0), DefaultRequestTimeout),
		retry:   cmp.Or(max(o.UnavailableRetry, 0), DefaultUnavailableRetry),
		base:    cmp.Or(max(c.EvictionBackoff.Duration, 0), qos.DefaultEvictionBackoff),
		events:  o.Events,
		metrics: o.Metrics,
		log:     o.Logger,
		now:     o.Now,
		// A bucket of perMin tokens refilled at perMin per minute: a burst
		// for memory pressure, at most perMin a minute on average.
		limiter: rate.NewLimiter(rate.Every(time.Minute/time.Duration(perMin)), perMin),
		wake:    make(chan struct{}, 1),
		backoff: map[types.UID]*backoff{},
		evicted: map[types.UID]time.Time{},
	}
	e.maxBack = max(c.MaxEvictionBackoff.Duration, e.base)
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.now == nil {
		e.now = time.Now
	}
	return e
}

// Submit hands the Evictor a request and the pods it may evict; it never
// blocks. The latest request wins: one not yet finished is replaced (its
// evictions so far stand). Candidates are copied; pods that are not batch
// are dropped (LS and BE pods are never evicted) and the rest ordered by
// qos.OrderEvictionCandidates. Pods already being deleted should be left out
// by the caller.
func (e *Evictor) Submit(req qos.EvictionRequest, candidates []qos.EvictionCandidate) error {
	switch {
	case req.Reason != qos.EvictReasonMemoryPressure && req.Reason != qos.EvictReasonCPUStarvation &&
		req.Reason != qos.EvictReasonGPUStarvation:
		return fmt.Errorf("reason %q: %w", req.Reason, ErrInvalidRequest)
	case req.MemoryToFree < 0:
		return fmt.Errorf("memoryToFree %d < 0: %w", req.MemoryToFree, ErrInvalidRequest)
	}
	cands := qos.OrderEvictionCandidates(slices.Clone(candidates))
	r := &request{req: req, cands: cands, status: RequestStatus{
		Submitted: e.now(), Reason: req.Reason, Message: req.String(), Candidates: len(cands), Outcome: "pending"}}
	e.mu.Lock()
	if e.pending != nil {
		e.pending.status.Outcome = "superseded"
	}
	e.last = r
	if len(cands) == 0 {
		e.pending = nil
		r.status.Outcome = "unsatisfied"
		e.mu.Unlock()
		return nil
	}
	e.pending = r
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default: // a wake-up is already pending; it will see this request
	}
	return nil
}

// Run performs submitted requests until ctx ends, then returns nil.
func (e *Evictor) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.wake:
		case <-timer.C:
		}
		if wait := e.process(ctx); wait > 0 {
			timer.Reset(wait)
		}
	}
}

// process works on the pending request until it is finished, superseded or
// rate-limited; it returns how long to wait for the rate limit (0: nothing
// to wait for).
func (e *Evictor) process(ctx context.Context) time.Duration {
	for ctx.Err() == nil {
		e.mu.Lock()
		p := e.pending
		if p == nil {
			e.mu.Unlock()
			return 0
		}
		now := e.now()
		e.sweep(now)
		if now.Before(e.unavailableUntil) {
			e.finish(p, "unavailable")
			e.mu.Unlock()
			return 0
		}
		c, ok := e.nextCandidate(p, now)
		if !ok {
			e.finish(p, "unsatisfied")
			e.mu.Unlock()
			e.log.Info("eviction request not satisfied: every candidate was refused, backed off or gone",
				"reason", p.req.Reason, "candidates", len(p.cands), "evicted", p.status.Evicted)
			return 0
		}
		if tokens := e.limiter.TokensAt(now); tokens < 1 {
			e.mu.Unlock()
			wait := time.Duration((1 - tokens) / float64(e.limiter.Limit()) * float64(time.Second))
			return max(wait, time.Millisecond)
		}
		e.mu.Unlock()

		var err error
		if !e.dryRun {
			err = e.post(ctx, c)
			if err != nil && ctx.Err() != nil {
				return 0 // stopping: not the pod's fault
			}
		}
		result := e.classify(c, err)
		e.report(p, c, result, err, e.now())
	}
	return 0
}

func (e *Evictor) post(ctx context.Context, c qos.EvictionCandidate) error {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	uid := c.UID
	ev := &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name},
		// The UID precondition keeps a new pod of the same name (a
		// StatefulSet's next incarnation) from being evicted in its place.
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	return e.api.EvictV1(ctx, ev)
}

// classify maps an eviction error to a metrics.EvictResult* value.
func (e *Evictor) classify(c qos.EvictionCandidate, err error) string {
	switch {
	case e.dryRun:
		return metrics.EvictResultDryRun
	case err == nil:
		return metrics.EvictResultEvicted
	case apierrors.IsTooManyRequests(err):
		return metrics.EvictResultBlockedPDB
	case apierrors.IsForbidden(err), apierrors.IsMethodNotSupported(err):
		return metrics.EvictResultUnavailable
	case apierrors.IsConflict(err):
		// The UID precondition failed: the pod of that name is another one.
		return metrics.EvictResultNotFound
	case apierrors.IsNotFound(err):
		if podGone(err, c) {
			return metrics.EvictResultNotFound
		}
		return metrics.EvictResultUnavailable
	}
	return metrics.EvictResultError
}

// podGone tells "this pod does not exist" (a Status naming the pod) from a
// 404 of the eviction endpoint itself, which client-go turns into an error
// with an UnexpectedServerResponse cause, or a Status naming something else.
func podGone(err error, c qos.EvictionCandidate) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return false
	}
	d := se.Status().Details
	if d == nil || d.Name != c.Name || d.Group != "" || (d.Kind != "pods" && d.Kind != "pod" && d.Kind != "Pod") {
		return false
	}
	for _, cause := range d.Causes {
		if cause.Type == metav1.CauseTypeUnexpectedServerResponse {
			return false
		}
	}
	return true
}

// report records the attempt: progress, backoff, status, metric, event, log.
func (e *Evictor) report(p *request, c qos.EvictionCandidate, result string, err error, now time.Time) {
	rec := &Record{Time: now, Namespace: c.Namespace, Name: c.Name, UID: c.UID, Reason: p.req.Reason, Result: result}
	var event, level = "", slog.LevelInfo
	firstUnavailable := false

	e.mu.Lock()
	p.next++
	switch result {
	case metrics.EvictResultEvicted, metrics.EvictResultDryRun:
		e.limiter.AllowN(now, 1)
		p.status.Evicted++
		p.status.FreedBytes += max(c.MemoryBytes, 0)
		delete(e.backoff, c.UID)
		if result == metrics.EvictResultEvicted {
			e.evicted[c.UID] = now
			rec.Message = fmt.Sprintf("evicted by Understory (%s); the pod used %d bytes of memory, priority %d",
				p.req.String(), c.MemoryBytes, c.Priority)
			event = EventEvicted
			if e.unavailable != nil {
				e.log.Info("eviction API available again")
				e.unavailable, e.unavailableUntil = nil, time.Time{}
			}
		} else {
			rec.Message = fmt.Sprintf("dry run: Understory would evict the pod (%s); it uses %d bytes of memory, priority %d",
				p.req.String(), c.MemoryBytes, c.Priority)
			event = EventEvictionDryRun
		}
		e.lastEviction = rec
		if p.req.Satisfied(p.status.Evicted, p.status.FreedBytes) {
			e.finish(p, "done")
		}
	case metrics.EvictResultNotFound:
		delete(e.backoff, c.UID)
		rec.Message = fmt.Sprintf("pod already gone: %v", err)
	case metrics.EvictResultBlockedPDB, metrics.EvictResultError:
		b := e.backOff(c, result, now)
		if result == metrics.EvictResultBlockedPDB {
			rec.Message = fmt.Sprintf("eviction refused by a PodDisruptionBudget (%s); retrying this pod after %v: %v",
				p.req.String(), b.delay, err)
			event = EventEvictionBlocked
		} else {
			rec.Message = fmt.Sprintf("eviction failed (%s); retrying this pod after %v: %v", p.req.String(), b.delay, err)
			event, level = EventEvictionFailed, slog.LevelWarn
			e.lastError = rec
		}
	case metrics.EvictResultUnavailable:
		firstUnavailable = e.unavailable == nil
		rec.Message = fmt.Sprintf("the agent cannot evict pods: %v; it needs RBAC create on pods/eviction and an "+
			"API server serving policy/v1 Eviction; evictions pause for %v", err, e.retry)
		e.unavailable, e.unavailableUntil = rec, now.Add(e.retry)
		e.lastError = rec
		e.finish(p, "unavailable")
		if firstUnavailable {
			event, level = EventEvictionFailed, slog.LevelError
		}
	}
	e.mu.Unlock()

	if e.metrics != nil {
		e.metrics.Evictions.WithLabelValues(p.req.Reason, result).Inc()
	}
	if result == metrics.EvictResultUnavailable && !firstUnavailable {
		e.log.Debug("eviction API still unavailable", "pod", c.Namespace+"/"+c.Name, "err", err)
		return
	}
	e.log.Log(context.Background(), level, rec.Message, "pod", c.Namespace+"/"+c.Name, "uid", string(c.UID),
		"reason", p.req.Reason, "result", result)
	if event != "" && e.events != nil {
		e.events.Warn(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: c.UID}},
			event, rec.Message)
	}
}

// backOff extends c's backoff (exponential, capped). e.mu is held.
func (e *Evictor) backOff(c qos.EvictionCandidate, result string, now time.Time) *backoff {
	b := e.backoff[c.UID]
	if b == nil {
		b = &backoff{ns: c.Namespace, name: c.Name, delay: e.base}
		e.backoff[c.UID] = b
	} else {
		b.delay = min(2*b.delay, e.maxBack)
	}
	b.failures++
	b.result = result
	b.until = now.Add(b.delay)
	return b
}

// nextCandidate returns the next candidate of p that is neither backed off
// nor already evicted, advancing p past the skipped ones. e.mu is held.
func (e *Evictor) nextCandidate(p *request, now time.Time) (qos.EvictionCandidate, bool) {
	for ; p.next < len(p.cands); p.next++ {
		// Submit's OrderEvictionCandidates left only batch pods: LS and BE are never here.
		c := p.cands[p.next]
		if b := e.backoff[c.UID]; b != nil && now.Before(b.until) {
			continue
		}
		if _, done := e.evicted[c.UID]; done {
			continue
		}
		return c, true
	}
	return qos.EvictionCandidate{}, false
}

// finish ends p with outcome, if it is still the pending request. e.mu is held.
func (e *Evictor) finish(p *request, outcome string) {
	if p.status.Outcome == "pending" {
		p.status.Outcome = outcome
	}
	if e.pending == p {
		e.pending = nil
	}
}

// sweep forgets backoffs quiet for maxBackoff and evictions older than
// evictedMemory. e.mu is held.
func (e *Evictor) sweep(now time.Time) {
	for uid, b := range e.backoff {
		if now.Sub(b.until) > e.maxBack {
			delete(e.backoff, uid)
		}
	}
	for uid, t := range e.evicted {
		if now.Sub(t) > evictedMemory || now.Before(t) {
			delete(e.evicted, uid)
		}
	}
}

// Status returns a snapshot (copies; safe to encode while the Evictor runs).
func (e *Evictor) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Status{DryRun: e.dryRun, UnavailableUntil: e.unavailableUntil}
	if e.last != nil {
		r := e.last.status
		s.LastRequest = &r
	}
	s.LastEviction, s.LastError, s.Unavailable = copyRecord(e.lastEviction), copyRecord(e.lastError),
		copyRecord(e.unavailable)
	for uid, b := range e.backoff {
		s.Blocked = append(s.Blocked, Blocked{Namespace: b.ns, Name: b.name, UID: uid, Result: b.result,
			Failures: b.failures, Backoff: b.delay.String(), Until: b.until})
	}
	slices.SortFunc(s.Blocked, func(a, b Blocked) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return s
}

func copyRecord(r *Record) *Record {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}
