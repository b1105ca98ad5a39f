package gpu

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
)

// PodInfo is what the GPU loop needs of a pod: who it is, its class, and (batch
// pods) the cgroup the duty cycle freezes.
type PodInfo struct {
	UID       types.UID
	Namespace string
	Name      string
	Class     qos.Class
	// Cgroup is the pod's cgroup relative to the hierarchy root (below the batch tier
	// or kubelet's own); empty while the agent has not found it.
	Cgroup string
	// Containers maps a runtime container ID (no runtime prefix) to its name.
	Containers map[string]string
	Priority   int32
	StartTime  time.Time
	// Terminating pods are never frozen, suspended nor evicted: they must handle
	// SIGTERM.
	Terminating bool
}

// PodView looks pods up by UID. The agent hands the GPU loop an immutable snapshot
// that its own control loop replaces as pods come and go; implementations must be
// safe for concurrent use.
type PodView interface {
	Pod(uid types.UID) (PodInfo, bool)
}

// PodMap is a PodView over a map; treat it as immutable once handed out.
type PodMap map[types.UID]PodInfo

var _ PodView = PodMap(nil)

// Pod returns the pod with uid.
func (m PodMap) Pod(uid types.UID) (PodInfo, bool) {
	p, ok := m[uid]
	return p, ok
}
