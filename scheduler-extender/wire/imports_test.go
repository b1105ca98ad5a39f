package wire

import (
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestImports keeps wire pure: the standard library's encoding and sync
// packages, the Kubernetes API types it decodes, and the placement core and
// wire contract it reads requests into; no client-go, no net/http, no clock.
func TestImports(t *testing.T) {
	t.Parallel()
	testenv.CheckPure(t, ".", "bytes", "encoding/json", "errors", "fmt", "hash/maphash", "slices", "strconv", "strings",
		"sync", "sync/atomic", "time",
		"k8s.io/api/core/v1", "k8s.io/apimachinery/pkg/api/resource", "k8s.io/apimachinery/pkg/util/validation",
		"k8s.io/kube-scheduler/extender/v1",
		"github.com/understory/understory/contract", "github.com/understory/understory/scheduler-extender/placement")
}
