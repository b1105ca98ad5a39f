package placement

import (
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestImports keeps the placement core pure: only these standard packages and the wire
// contract (itself pure: the bounds both binaries share), so no client-go, no
// net/http, no locks, no clock, no I/O (docs/extender.md).
func TestImports(t *testing.T) {
	t.Parallel()
	testenv.CheckPure(t, ".", "cmp", "errors", "fmt", "math", "math/bits", "math/rand", "slices", "strings",
		"github.com/understory/understory/contract")
}
