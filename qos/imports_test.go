package qos_test

import (
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestPureImports keeps qos a pure policy layer: no IO, no clock, no locks, no
// network, no cgroups. It may use the standard library's pure packages, Kubernetes'
// API types and the wire contract (pure itself: the names it classifies by); "time"
// is for its types, the clock is the caller's.
func TestPureImports(t *testing.T) {
	t.Parallel()
	testenv.CheckPure(t, ".",
		"errors", "fmt", "math", "slices", "sort", "strings", "strconv", "time", "unicode/utf8", "cmp",
		"k8s.io/api/core/v1", "k8s.io/apimachinery/pkg/apis/meta/v1",
		"k8s.io/apimachinery/pkg/api/resource", "k8s.io/apimachinery/pkg/types",
		"sigs.k8s.io/yaml", "go.yaml.in/yaml/v2",
		"github.com/understory/understory/contract")
}
