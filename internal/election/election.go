package election

import (
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// ErrConfig marks an unusable Config.
var ErrConfig = errors.New("invalid leader election config")

// Config is the Lease replicas compete for and the election's timing.
type Config struct {
	// Namespace and Name of the coordination.k8s.io Lease.
	Namespace, Name string
	// Identity of this replica (its pod name), unique among the replicas.
	Identity string
	// LeaseDuration is how long a standby waits after the leader's last renewal
	// before it takes the Lease; RenewDeadline how long the leader keeps trying to
	// renew before it gives up; RetryPeriod how often both try.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Validate returns an error wrapping ErrConfig when c is unusable; client-go's
// own rules included (LeaseDuration > RenewDeadline > JitterFactor × RetryPeriod).
func (c Config) Validate() error {
	switch {
	case c.Namespace == "" || c.Name == "" || c.Identity == "":
		return fmt.Errorf("%w: lease namespace %q, name %q and identity %q must all be set",
			ErrConfig, c.Namespace, c.Name, c.Identity)
	case c.RetryPeriod <= 0:
		return fmt.Errorf("%w: retry period %v must be positive", ErrConfig, c.RetryPeriod)
	case float64(c.RenewDeadline) <= leaderelection.JitterFactor*float64(c.RetryPeriod):
		return fmt.Errorf("%w: renew deadline %v must exceed %.1f × retry period %v", ErrConfig,
			c.RenewDeadline, leaderelection.JitterFactor, c.RetryPeriod)
	case c.LeaseDuration < time.Second || c.LeaseDuration%time.Second != 0:
		return fmt.Errorf("%w: lease duration %v must be whole seconds (the Lease records seconds)", ErrConfig,
			c.LeaseDuration)
	case c.LeaseDuration <= c.RenewDeadline:
		return fmt.Errorf("%w: lease duration %v must exceed renew deadline %v", ErrConfig, c.LeaseDuration,
			c.RenewDeadline)
	}
	return nil
}

// NewElector is client-go's elector for c's Lease, through client, with cb; it
// releases the Lease when the context given to its Run ends. Errors wrap
// ErrConfig.
func NewElector(client kubernetes.Interface, c Config, cb leaderelection.LeaderCallbacks) (*leaderelection.LeaderElector, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.Identity},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: c.Name, ReleaseOnCancel: true,
		LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod,
		Callbacks: cb,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return le, nil
}
