package signals

import (
	"os"
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestMain runs the tests, failing the run if they leave a file descriptor open: a
// Source holds PSI triggers, epoll instances and BPF maps for the agent's whole life,
// so a descriptor it forgets to close is a leak in production.
func TestMain(m *testing.M) {
	os.Exit(testenv.RunCheckingFDs(m))
}
