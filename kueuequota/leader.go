package kueuequota

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/understory/understory/internal/election"
)

// LeaseName is the default name of the follower's leader Lease.
const LeaseName = "understory-kueue-quota"

// ErrLeadershipLost means this replica led and could not renew its Lease within
// RenewDeadline. RunElected returns it; the process must then exit (non-zero, so
// that the Deployment restarts it as a standby): another replica may lead already.
var ErrLeadershipLost = errors.New("leader lease lost")

// ErrLeaderConfig marks an unusable LeaderConfig.
var ErrLeaderConfig = election.ErrConfig

// LeaderConfig configures leader election between follower replicas (RunElected):
// the Lease and its timing. A leader that cannot renew within RenewDeadline stops
// its passes and RunElected returns ErrLeadershipLost.
type LeaderConfig = election.Config

// DefaultLeaderConfig is the Lease LeaseName in namespace, held as identity, with
// client-go's usual durations (lease 15 s, renew deadline 10 s, retry 2 s): a
// killed leader is replaced within about 17 s, one stopped gracefully at once.
func DefaultLeaderConfig(namespace, identity string) LeaderConfig {
	return LeaderConfig{Namespace: namespace, Name: LeaseName, Identity: identity,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
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
	// OnStartedLeading runs on its own goroutine (client-go starts it just before
	// it renews); RunElected waits for it, and one that would start after the
	// election ended does nothing.
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		closed bool
	)
	le, err := election.NewElector(f.client, lc, leaderelection.LeaderCallbacks{
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
	})
	if err != nil {
		return err
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
