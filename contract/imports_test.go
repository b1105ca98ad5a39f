package contract

import (
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestImports keeps the contract pure, as both binaries and the pure placement core
// import it: standard packages for encoding and values only, no client-go, no net, no
// os, no locks, no clock.
func TestImports(t *testing.T) {
	t.Parallel()
	testenv.CheckPure(t, ".", "encoding/json", "errors", "fmt", "math", "slices", "strconv", "strings", "time",
		"unicode/utf8")
}
