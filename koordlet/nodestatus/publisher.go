package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/understory/understory/contract"
)

// Defaults of the options.
const (
	// DefaultRequestTimeout bounds one GET or PATCH.
	DefaultRequestTimeout = 10 * time.Second
	// DefaultResync is how often the writer re-reads its Node to repair values kubelet
	// (or anyone) reset.
	DefaultResync = time.Minute
)

// DefaultBackoff is the retry back-off: 200 ms doubling to 30 s, each wait up to 20 %
// longer (jitter, so that agents failing together do not retry together).
func DefaultBackoff() wait.Backoff {
	return wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30,
		Cap: 30 * time.Second}
}

// Sentinel errors.
var (
	// ErrAlreadyRunning is returned by a second concurrent Run.
	ErrAlreadyRunning = errors.New("node status publisher already running")
	// ErrInvalidConfig is returned by New for a missing client or node name.
	ErrInvalidConfig = errors.New("invalid node status publisher config")

	errNoAllocatable = errors.New("node has no allocatable resources (not registered by kubelet yet?)")
)

// NodeClient reads and patches Nodes. client-go's typed NodeInterface satisfies it
// (checked in the tests; importing it here would link every API group, see doc.go).
type NodeClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions,
		subresources ...string) (*corev1.Node, error)
}

// Resources are the batch resources to publish.
type Resources struct {
	// CPUMilli is understory.io/batch-cpu, in millicores.
	CPUMilli int64 `json:"cpuMilli"`
	// MemoryBytes is understory.io/batch-memory, in bytes.
	MemoryBytes int64 `json:"memoryBytes"`
}

// Status is the publisher's state for the agent's /status.
type Status struct {
	Node string `json:"node"`
	// Desired is the latest value handed to Set; nil before the first.
	Desired *Resources `json:"desired,omitempty"`
	// Written is what the Node holds, as last confirmed by a patch response or a read;
	// nil when unknown or absent there.
	Written *Resources `json:"written,omitempty"`
	// DesiredGPUMilli is the latest value handed to SetGPUMilli; nil before the first
	// (understory.io/gpu-milli is then never written). WrittenGPUMilli is what the Node
	// holds of it, like Written.
	DesiredGPUMilli *int64 `json:"desiredGPUMilli,omitempty"`
	WrittenGPUMilli *int64 `json:"writtenGPUMilli,omitempty"`
	// WrittenAt is when Written (or WrittenGPUMilli) was last confirmed.
	WrittenAt time.Time `json:"writtenAt,omitzero"`
	// Synced: the Node holds Desired and DesiredGPUMilli (those that are set).
	Synced bool `json:"synced"`
	// Waiting says why nothing can be written now ("node not found", "node has no
	// allocatable ..."); empty otherwise.
	Waiting     string    `json:"waiting,omitempty"`
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// Attempts counts sync attempts (a read, a patch or both), Writes the successful
	// patches, Failures the failed attempts, Clamped the negative values Set and
	// SetGPUMilli received.
	Attempts int64 `json:"attempts"`
	Writes   int64 `json:"writes"`
	Failures int64 `json:"failures"`
	Clamped  int64 `json:"clamped"`
}

// Option configures a Publisher.
type Option func(*config)

type config struct {
	log              *slog.Logger
	backoff          wait.Backoff
	timeout, resync  time.Duration
	writes, failures prometheus.Counter
}

// WithLogger sets the logger (default slog.Default()). Nil is ignored.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}

// WithBackoff replaces DefaultBackoff. A back-off with a non-positive Duration, a
// Factor below 1 or a negative Jitter is ignored; Steps < 1 means "never grow", so it
// is raised to grow until Cap.
func WithBackoff(b wait.Backoff) Option {
	return func(c *config) {
		if b.Duration <= 0 || b.Factor < 1 || b.Jitter < 0 {
			return
		}
		if b.Steps < 1 {
			b.Steps = 1 << 30
		}
		c.backoff = b
	}
}

// WithRequestTimeout replaces DefaultRequestTimeout. Non-positive values are ignored.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithResync replaces DefaultResync; 0 turns the periodic re-read off. Negative values
// are ignored.
func WithResync(d time.Duration) Option {
	return func(c *config) {
		if d >= 0 {
			c.resync = d
		}
	}
}

// WithCounters counts successful patches and failed attempts (either may be nil),
// e.g. metrics.Agent's error counter with its own kind.
func WithCounters(writes, failures prometheus.Counter) Option {
	return func(c *config) { c.writes, c.failures = writes, failures }
}

// Publisher writes the batch resources, and the shared-GPU capacity, of one Node. Set,
// SetGPUMilli and Status are safe for concurrent use; Run is the single writer.
type Publisher struct {
	nodes   NodeClient
	node    string
	cfg     config
	wake    chan struct{}
	running atomic.Bool

	mu sync.Mutex
	st Status
	// want is what Set and SetGPUMilli asked for (also in st.Desired*).
	want target

	// Writer-only state (Run's goroutine).
	problem string // class of the current failure streak, to log each kind once
	streak  int
	ever    bool // a write or confirmation has succeeded once
}

// New returns a publisher for the Node named node.
func New(nodes NodeClient, node string, opts ...Option) (*Publisher, error) {
	if nodes == nil || node == "" {
		return nil, fmt.Errorf("client and node name are required: %w", ErrInvalidConfig)
	}
	cfg := config{log: slog.Default(), backoff: DefaultBackoff(), timeout: DefaultRequestTimeout,
		resync: DefaultResync}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.log = cfg.log.With("node", node)
	return &Publisher{nodes: nodes, node: node, cfg: cfg, wake: make(chan struct{}, 1), st: Status{Node: node}}, nil
}

// target is what the Node should hold (or holds) of the keys the publisher manages; a
// part that is not set is not managed (never written), or, read from a Node, absent
// or inconsistent there.
type target struct {
	batch    Resources
	hasBatch bool
	gpuMilli int64
	hasGPU   bool
}

// holds reports whether t (what a Node holds) has every part of want.
func (t target) holds(want target) bool {
	return (!want.hasBatch || t.hasBatch && t.batch == want.batch) &&
		(!want.hasGPU || t.hasGPU && t.gpuMilli == want.gpuMilli)
}

// Set makes r the value to publish, replacing any value not yet written, and returns
// at once. Negative fields are clamped to 0; clamped reports whether any was.
func (p *Publisher) Set(r Resources) (clamped bool) {
	if r.CPUMilli < 0 {
		r.CPUMilli, clamped = 0, true
	}
	if r.MemoryBytes < 0 {
		r.MemoryBytes, clamped = 0, true
	}
	p.update(clamped, func(t *target) { t.batch, t.hasBatch = r, true })
	return clamped
}

// SetGPUMilli makes milli the understory.io/gpu-milli to publish (1000 per GPU the
// agent shares: the extender places shared-GPU pods against it), replacing any value
// not yet written, and returns at once. A negative value is clamped to 0. Until the
// first call the key is left alone, so a node without GPU support never gets it; a
// node whose GPUs went away should set 0.
//
// It is separate from Set because its producer is: the GPU inventory changes when
// devices come or go, the batch resources every few seconds.
func (p *Publisher) SetGPUMilli(milli int64) (clamped bool) {
	if milli < 0 {
		milli, clamped = 0, true
	}
	p.update(clamped, func(t *target) { t.gpuMilli, t.hasGPU = milli, true })
	return clamped
}

func (p *Publisher) update(clamped bool, set func(*target)) {
	p.mu.Lock()
	if clamped {
		p.st.Clamped++
	}
	old := p.want
	set(&p.want)
	changed := p.want != old
	if changed {
		p.st.Desired, p.st.DesiredGPUMilli = p.want.batchPtr(), p.want.gpuPtr()
	}
	p.mu.Unlock()
	if changed {
		select {
		case p.wake <- struct{}{}:
		default: // a wake-up is already pending; the writer reads the latest value
		}
	}
}

func (t target) batchPtr() *Resources {
	if !t.hasBatch {
		return nil
	}
	r := t.batch
	return &r
}

func (t target) gpuPtr() *int64 {
	if !t.hasGPU {
		return nil
	}
	v := t.gpuMilli
	return &v
}

// Status returns a snapshot.
func (p *Publisher) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.st
	s.Desired, s.Written = clone(s.Desired), clone(s.Written)
	s.DesiredGPUMilli, s.WrittenGPUMilli = clone(s.DesiredGPUMilli), clone(s.WrittenGPUMilli)
	onNode := target{}
	if s.Written != nil {
		onNode.batch, onNode.hasBatch = *s.Written, true
	}
	if s.WrittenGPUMilli != nil {
		onNode.gpuMilli, onNode.hasGPU = *s.WrittenGPUMilli, true
	}
	s.Synced = (p.want.hasBatch || p.want.hasGPU) && onNode.holds(p.want)
	return s
}

func clone[T any](r *T) *T {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

func (p *Publisher) desired() (target, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.want, p.want.hasBatch || p.want.hasGPU
}

// Run writes every new value until ctx is done, then returns nil. A write that fails is
// retried after the back-off; a value Set meanwhile replaces it but does not cut the
// wait short, so a control loop setting new values cannot turn failures into a hot loop.
func (p *Publisher) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer p.running.Store(false)
	var resync <-chan time.Time
	if p.cfg.resync > 0 {
		t := time.NewTicker(p.cfg.resync)
		defer t.Stop()
		resync = t.C
	}
	var (
		verify = true         // read the Node before the next write
		onNode *target        // what the Node holds as far as the writer knows
		delay  wait.DelayFunc // set during a failure streak
		retry  *time.Timer
	)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil
		}
		want, ok := p.desired()
		if ok && retry == nil && (verify || onNode == nil || !onNode.holds(want)) {
			got, err := p.sync(ctx, want, verify)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				if delay == nil {
					delay = p.cfg.backoff.DelayFunc()
				}
				verify, onNode = true, got
				retry = time.NewTimer(delay())
				continue
			}
			verify, onNode, delay = false, got, nil
			continue
		}
		var retryC <-chan time.Time
		if retry != nil {
			retryC = retry.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.wake:
		case <-retryC:
			retry = nil
		case <-resync:
			verify = true
		}
	}
}

// sync makes the Node hold want: it reads the Node first when verify is set, and
// patches unless the read shows want already there. It returns what the Node holds as
// far as it knows (nil: unknown).
func (p *Publisher) sync(ctx context.Context, want target, verify bool) (*target, error) {
	p.mu.Lock()
	p.st.Attempts++
	p.mu.Unlock()
	if verify {
		node, err := p.get(ctx)
		if err != nil {
			p.fail(ctx, err)
			return nil, err
		}
		cur := published(node)
		if cur.holds(want) {
			p.succeed(want, false)
			return &cur, nil
		}
		p.mu.Lock()
		p.st.Written, p.st.WrittenGPUMilli = cur.batchPtr(), cur.gpuPtr()
		p.mu.Unlock()
	}
	if err := p.patch(ctx, want); err != nil {
		p.fail(ctx, err)
		return nil, err
	}
	p.succeed(want, true)
	return &want, nil
}

func (p *Publisher) get(ctx context.Context) (*corev1.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.timeout)
	defer cancel()
	// resourceVersion "0": served from the API server's watch cache (see doc.go).
	node, err := p.nodes.Get(ctx, p.node, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", p.node, err)
	}
	if node == nil || len(node.Status.Allocatable) == 0 {
		return nil, fmt.Errorf("node %s: %w", p.node, errNoAllocatable)
	}
	return node, nil
}

func (p *Publisher) patch(ctx context.Context, t target) error {
	body, err := patchFor(t)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.timeout)
	defer cancel()
	if _, err := p.nodes.Patch(ctx, p.node, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patching status of node %s: %w", p.node, err)
	}
	return nil
}

// PatchFor is the JSON merge patch for nodes/NAME/status that sets r in capacity and
// allocatable and touches no other key.
func PatchFor(r Resources) ([]byte, error) {
	return patchFor(target{batch: r, hasBatch: true})
}

// GPUPatchFor is the JSON merge patch for nodes/NAME/status that sets
// understory.io/gpu-milli to milli in capacity and allocatable and touches no other key.
func GPUPatchFor(milli int64) ([]byte, error) {
	return patchFor(target{gpuMilli: milli, hasGPU: true})
}

// patchFor sets the parts of t that are set, in capacity and allocatable.
func patchFor(t target) ([]byte, error) {
	list := map[string]string{}
	if t.hasBatch {
		list[contract.ResourceBatchCPU] = strconv.FormatInt(max(t.batch.CPUMilli, 0), 10)
		list[contract.ResourceBatchMemory] = strconv.FormatInt(max(t.batch.MemoryBytes, 0), 10)
	}
	if t.hasGPU {
		list[contract.ResourceGPUMilli] = strconv.FormatInt(max(t.gpuMilli, 0), 10)
	}
	b, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": list, "allocatable": list}})
	if err != nil {
		return nil, fmt.Errorf("encoding node status patch: %w", err)
	}
	return b, nil
}

// published is what node holds of the managed keys: the batch part only when both
// batch keys are in both capacity and allocatable with equal values, the GPU part
// likewise for understory.io/gpu-milli.
func published(node *corev1.Node) target {
	var t target
	value := func(name corev1.ResourceName) (int64, bool) {
		c, okc := node.Status.Capacity[name]
		a, oka := node.Status.Allocatable[name]
		if !okc || !oka || c.Cmp(a) != 0 {
			return 0, false
		}
		return a.Value(), true
	}
	cpu, okCPU := value(contract.ResourceBatchCPU)
	mem, okMem := value(contract.ResourceBatchMemory)
	if okCPU && okMem {
		t.batch, t.hasBatch = Resources{CPUMilli: cpu, MemoryBytes: mem}, true
	}
	t.gpuMilli, t.hasGPU = value(contract.ResourceGPUMilli)
	return t
}

// succeed records that the Node holds want's parts (the other parts stay as known).
func (p *Publisher) succeed(want target, patched bool) {
	p.mu.Lock()
	if want.hasBatch {
		p.st.Written = want.batchPtr()
	}
	if want.hasGPU {
		p.st.WrittenGPUMilli = want.gpuPtr()
	}
	p.st.WrittenAt, p.st.Waiting = time.Now(), ""
	if patched {
		p.st.Writes++
	}
	p.mu.Unlock()
	if patched && p.cfg.writes != nil {
		p.cfg.writes.Inc()
	}
	var attrs []any
	if want.hasBatch {
		attrs = append(attrs, "cpuMilli", want.batch.CPUMilli, "memoryBytes", want.batch.MemoryBytes)
	}
	if want.hasGPU {
		attrs = append(attrs, "gpuMilli", want.gpuMilli)
	}
	attrs = append(attrs, "patched", patched)
	switch {
	case p.streak > 0:
		p.cfg.log.Info("batch resources published on node after failures", append(attrs, "failures", p.streak)...)
	case !p.ever:
		p.cfg.log.Info("batch resources published on node", attrs...)
	default:
		p.cfg.log.Debug("batch resources published on node", attrs...)
	}
	p.ever, p.problem, p.streak = true, "", 0
}

// fail records err and logs it when its kind differs from the streak's previous one, so
// a Node that stays unregistered or missing logs one line, not one per retry.
func (p *Publisher) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // shutting down: not a failure of the API
	}
	kind, waiting := classify(err)
	now := time.Now()
	p.mu.Lock()
	p.st.Failures++
	p.st.LastError, p.st.LastErrorAt, p.st.Waiting = err.Error(), now, waiting
	p.mu.Unlock()
	if p.cfg.failures != nil {
		p.cfg.failures.Inc()
	}
	p.streak++
	if kind == p.problem {
		p.cfg.log.Debug("publishing batch resources failed again", "err", err, "failures", p.streak)
		return
	}
	p.problem = kind
	switch {
	case waiting != "":
		p.cfg.log.Warn("batch resources not published: "+waiting+"; retrying with back-off", "err", err)
	default:
		p.cfg.log.Warn("publishing batch resources failed; retrying with back-off", "err", err)
	}
}

// classify names err's kind for log deduplication, and for the two states where the
// Node cannot take a value yet, says so.
func classify(err error) (kind, waiting string) {
	switch {
	case errors.Is(err, errNoAllocatable):
		return "no-allocatable", "node has no allocatable resources yet (not registered by kubelet?)"
	case apierrors.IsNotFound(err):
		return "not-found", "node not found"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout", ""
	}
	if r := apierrors.ReasonForError(err); r != metav1.StatusReasonUnknown {
		return string(r), ""
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return strconv.Itoa(int(st.Status().Code)), ""
	}
	return "other", ""
}
