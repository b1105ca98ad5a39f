package kueuequota

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the default name of the follower's leader Lease.
const LeaseName = "understory-kueue-quota"

// ErrLeadershipLost means this replica led and could not renew its Lease within
// RenewDeadline. RunElected returns it; the process must then exit (non-zero, so
// that the Deployment restarts it as a standby): another replica may lead already.
var ErrLeadershipLost = errors.New("leader lease lost")

// ErrLeaderConfig marks an unusable LeaderConfig.
var ErrLeaderConfig = errors.New("invalid leader election config")

// LeaderConfig configures leader election between follower replicas (RunElected).
type LeaderConfig struct {
	// Namespace and Name of the coordination.k8s.io Lease.
	Namespace, Name string
	// Identity of this replica (its pod name), unique among the replicas.
	Identity string
	// LeaseDuration is how long a standby waits after the leader's last renewal
	// before it takes the Lease; RenewDeadline how long the leader keeps trying to
	// renew before it gives up (RunElected returns ErrLeadershipLost); RetryPeriod
	// how often both try.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultLeaderConfig is the Lease LeaseName in namespace, held as identity, with
// client-go's usual durations (lease 15 s, renew deadline 10 s, retry 2 s): a
// killed leader is replaced within about 17 s, one stopped gracefully at once.
func DefaultLeaderConfig(namespace, identity string) LeaderConfig {
	return LeaderConfig{Namespace: namespace, Name: LeaseName, Identity: identity,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
}

// Validate returns an error wrapping ErrLeaderConfig when c is unusable; client-go's
// own rules included (LeaseDuration > RenewDeadline > 1.2 × RetryPeriod).
func (c LeaderConfig) Validate() error {
	switch {
	case c.Namespace == "" || c.Name == "" || c.Identity == "":
		return fmt.Errorf("%w: lease namespace %q, name %q and identity %q must all be set",
			ErrLeaderConfig, c.Namespace, c.Name, c.Identity)
	case c.RetryPeriod <= 0:
		return fmt.Errorf("%w: retry period %v must be positive", ErrLeaderConfig, c.RetryPeriod)
	case float64(c.RenewDeadline) <= leaderelection.JitterFactor*float64(c.RetryPeriod):
		return fmt.Errorf("%w: renew deadline %v must exceed %.1f × retry period %v", ErrLeaderConfig,
			c.RenewDeadline, leaderelection.JitterFactor, c.RetryPeriod)
	case c.LeaseDuration < time.Second || c.LeaseDuration%time.Second != 0:
		return fmt.Errorf("%w: lease duration %v must be whole seconds (the Lease records seconds)", ErrLeaderConfig,
			c.LeaseDuration)
	case c.LeaseDuration <= c.RenewDeadline:
		return fmt.Errorf("%w: lease duration %v must exceed renew deadline %v", ErrLeaderConfig, c.LeaseDuration,
			c.RenewDeadline)
	}
	return nil
}

// RunElected is Run among replicas: it starts the Node informer (so that /readyz,
// Synced, is the same on every replica), waits for it, and then competes for the
// Lease of lc; only while it holds the Lease does it run passes. It returns nil
// when ctx ends (a held Lease is released first, so that a standby takes over at
// once), and ErrLeadershipLost when it led and could not renew the Lease: no pass
// runs after that, and the caller must exit.
func (f *Follower) RunElected(ctx context.Context, lc LeaderConfig) error {
	if err := lc.Validate(); err != nil {
		return err
	}
	// The informer stops before Shutdown waits for it, also when RunElected
	// returns before ctx ends (the Lease lost).
	ictx, stopInformer := context.WithCancel(ctx)
	f.factory.Start(ictx.Done())
	defer f.factory.Shutdown()
	defer stopInformer()
	if !cache.WaitForCacheSync(ctx.Done(), f.synced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("node informer did not sync")
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: lc.Namespace, Name: lc.Name},
		Client:     f.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: lc.Identity},
	}
	// OnStartedLeading runs on its own goroutine (client-go starts it just before
	// it renews); RunElected waits for it, and one that would start after the
	// election ended does nothing.
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		closed bool
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: lc.Name, ReleaseOnCancel: true,
		LeaseDuration: lc.LeaseDuration, RenewDeadline: lc.RenewDeadline, RetryPeriod: lc.RetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				mu.Lock()
				if closed {
					mu.Unlock()
					return
				}
				wg.Add(1)
				mu.Unlock()
				defer wg.Done()
				f.m.leader.Set(1)
				f.log.Info("leading: running quota passes", "identity", lc.Identity,
					"lease", lc.Namespace+"/"+lc.Name)
				// lctx ends when the Lease is lost or ctx ends; passes returns then.
				_ = f.passes(lctx)
			},
			OnStoppedLeading: func() { f.m.leader.Set(0) },
			OnNewLeader: func(identity string) {
				if identity != "" {
					f.log.Info("leader observed", "leader", identity, "self", identity == lc.Identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrLeaderConfig, err)
	}
	le.Run(ctx)
	mu.Lock()
	closed = true
	mu.Unlock()
	wg.Wait()
	f.m.leader.Set(0)
	// Run returns before ctx ends only when a leader failed to renew: acquiring
	// waits for as long as ctx lasts.
	if ctx.Err() == nil {
		return fmt.Errorf("%s could not renew Lease %s/%s: %w", lc.Identity, lc.Namespace, lc.Name, ErrLeadershipLost)
	}
	return nil
}
