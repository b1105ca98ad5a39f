package extender

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/placement"
)

// ErrInvalidConfig means a Config value is out of range.
var ErrInvalidConfig = errors.New("invalid extender config")

// Config tunes the extender. Zero values are not defaults: start from DefaultConfig.
type Config struct {
	// Policy names the placement policy (see PolicyNames).
	Policy string
	// WorkloadCoverage is the share of pods the target workload classes cover (fgd,
	// understory); 0 means the policy's own default (fgd: DefaultCoverage, the
	// paper's 95 %; understory: DefaultUnderstoryCoverage).
	WorkloadCoverage float64
	// WorkloadRefresh is how often the target workload is rebuilt from the pods in the index.
	WorkloadRefresh time.Duration
	// Seed seeds the random policy and tie-breaking; 0 picks one from the clock.
	Seed int64

	// NodeCacheCapable must match the scheduler's extender setting
	// nodeCacheCapable. When set, nodes are never learned from request bodies
	// (only the node informer knows nodes); when not, a filter's full Node
	// objects teach the index nodes it does not know yet, until calls stop
	// carrying them.
	NodeCacheCapable bool

	// MetricsMaxAge: a node-metrics annotation older than this is treated as unknown (Node.Usage = nil).
	// Agents rewrite an unchanged one every nodeMetricsReport.maxInterval (2 min by default).
	MetricsMaxAge time.Duration
	// MetricsMaxSkew: a node-metrics annotation stamped further than this in the
	// future (a node's clock ahead of ours) is treated as unknown too; otherwise it
	// would stay fresh until our clock caught up.
	MetricsMaxSkew time.Duration
	// AssumedTTL is how long a filter reservation waits for its bind before it is released.
	AssumedTTL time.Duration
	// GangPlanTTL is how long a gang's placement plan holds capacity while its members reach bind.
	GangPlanTTL time.Duration
	// VolcanoPodGroups watches Volcano's PodGroups (scheduling.volcano.sh/v1beta1,
	// with Deps.Dynamic) for the minMember of Volcano gangs.
	VolcanoPodGroups bool
	// MaxGangMembers caps a gang's minMember: planning costs minMember Selects
	// over the candidate nodes, so a larger gang is refused as unresolvable
	// with the reason instead of being planned.
	MaxGangMembers int
	// GangBindTimeout bounds how long one member's bind call waits for the rest of its gang.
	// It must stay below kube-scheduler's extender httpTimeout.
	GangBindTimeout time.Duration
	// APITimeout bounds each API call the extender makes (patch, binding, get).
	APITimeout time.Duration
	// Housekeeping is the period of the loop that expires reservations and plans
	// and re-checks node-metrics freshness.
	Housekeeping time.Duration
	// InformerResync is the informers' resync period (0 disables resync).
	InformerResync time.Duration
	// MaxCacheStaleness: once the node or pod informer has been out of contact
	// with the API server for longer (no watch open, no list or event since),
	// binds are refused with 503 and kube-scheduler retries them; filters keep
	// being served from the cache.
	MaxCacheStaleness time.Duration

	// MaxBodyBytes caps a request body; larger bodies get 413.
	MaxBodyBytes int64
	// LargeBodyBytes and MaxLargeRequests limit concurrent large requests: at
	// most MaxLargeRequests filter, prioritize or bind requests whose body
	// exceeds LargeBodyBytes (or has no Content-Length) are handled at once;
	// more get 429 at once, and kube-scheduler retries the pod. A large body is
	// a nodeCacheCapable=false call carrying full Node objects: decoding it
	// costs several times its size in memory.
	LargeBodyBytes   int64
	MaxLargeRequests int
	// PodCacheBytes bounds the memory of the decoded-pod cache of filter and
	// prioritize (an estimate: the kept JSON and the decoded pod).
	PodCacheBytes int64
	// LockHoldMetric exports understory_extender_index_lock_hold_seconds, a
	// histogram of the index's write-lock holds (two clock reads per write
	// lock; off, the cost is one nil check).
	LockHoldMetric bool
	// HTTP server timeouts.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
}

// DefaultConfig is the configuration the binary starts from.
func DefaultConfig() Config {
	return Config{
		Policy:            placement.DefaultPolicy,
		WorkloadCoverage:  0,
		WorkloadRefresh:   time.Minute,
		NodeCacheCapable:  true,
		MetricsMaxAge:     contract.DefaultMetricsMaxAge,
		MetricsMaxSkew:    contract.DefaultMetricsMaxSkew,
		AssumedTTL:        30 * time.Second,
		GangPlanTTL:       60 * time.Second,
		GangBindTimeout:   20 * time.Second,
		MaxGangMembers:    1000,
		VolcanoPodGroups:  true,
		APITimeout:        5 * time.Second,
		Housekeeping:      time.Second,
		InformerResync:    0,
		MaxCacheStaleness: 30 * time.Second,
		MaxBodyBytes:      10 << 20,
		LargeBodyBytes:    1 << 20,
		MaxLargeRequests:  4,
		PodCacheBytes:     32 << 20,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      40 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

// Validate checks ranges and the relations between timeouts.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf(format+": %w", append(a, ErrInvalidConfig)...))
	}
	if c.WorkloadCoverage < 0 || c.WorkloadCoverage > 1 || math.IsNaN(c.WorkloadCoverage) {
		bad("workload coverage %v must be in (0,1], or 0 for the policy's default", c.WorkloadCoverage)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"workload refresh", c.WorkloadRefresh}, {"metrics max age", c.MetricsMaxAge},
		{"assumed ttl", c.AssumedTTL}, {"gang plan ttl", c.GangPlanTTL},
		{"gang bind timeout", c.GangBindTimeout}, {"api timeout", c.APITimeout},
		{"housekeeping", c.Housekeeping}, {"read header timeout", c.ReadHeaderTimeout},
		{"max cache staleness", c.MaxCacheStaleness},
		{"read timeout", c.ReadTimeout}, {"write timeout", c.WriteTimeout}, {"idle timeout", c.IdleTimeout},
	} {
		if d.v <= 0 {
			bad("%s %v must be > 0", d.name, d.v)
		}
	}
	if c.MaxGangMembers < 1 || c.MaxGangMembers > contract.MaxGangSize {
		bad("max gang members %d must be in 1..%d", c.MaxGangMembers, contract.MaxGangSize)
	}
	if c.MetricsMaxSkew < 0 {
		bad("metrics max skew %v must be >= 0", c.MetricsMaxSkew)
	}
	if c.InformerResync < 0 {
		bad("informer resync %v must be >= 0", c.InformerResync)
	}
	if c.PodCacheBytes < 0 {
		bad("pod cache bytes %d must be >= 0 (0: no cache)", c.PodCacheBytes)
	}
	if c.MaxBodyBytes < 1<<10 {
		bad("max body bytes %d must be >= 1024", c.MaxBodyBytes)
	}
	if c.LargeBodyBytes < 1<<10 {
		bad("large body bytes %d must be >= 1024", c.LargeBodyBytes)
	}
	if c.MaxLargeRequests < 1 {
		bad("max large requests %d must be >= 1", c.MaxLargeRequests)
	}
	// A gang member's bind waits up to GangBindTimeout, then the committing bind
	// creates the members' Bindings (one API call each, maxParallelAPI at a
	// time); the server must not cut the response off before that. Two
	// APITimeouts of margin cover a gang of up to 2 × maxParallelAPI members
	// even when every call runs to its timeout.
	if c.WriteTimeout <= c.GangBindTimeout+2*c.APITimeout {
		bad("write timeout %v must exceed gang bind timeout %v + 2 × api timeout %v", c.WriteTimeout, c.GangBindTimeout, c.APITimeout)
	}
	if c.GangPlanTTL < c.GangBindTimeout {
		bad("gang plan ttl %v must be >= gang bind timeout %v", c.GangPlanTTL, c.GangBindTimeout)
	}
	if _, err := placement.NewPolicy(c.Policy, nil, nil); err != nil {
		errs = append(errs, fmt.Errorf("policy: %w", err))
	}
	return errors.Join(errs...)
}
