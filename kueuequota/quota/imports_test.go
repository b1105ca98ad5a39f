package quota_test

import (
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestPureImports keeps the quota decisions pure: no IO, no clock, no client, so
// they are tested as plain functions and the follower alone talks to the cluster.
func TestPureImports(t *testing.T) {
	t.Parallel()
	testenv.CheckPure(t, ".", "errors", "fmt", "math", "slices", "strings")
}
