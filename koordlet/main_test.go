package koordlet

import (
	"os"
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestMain runs the tests, failing the run if they leave a file descriptor open: the
// agent holds hundreds of cgroup files, PSI triggers and BPF maps for its whole life,
// so a descriptor it forgets to close is a leak in production.
func TestMain(m *testing.M) {
	os.Exit(testenv.RunCheckingFDs(m))
}
