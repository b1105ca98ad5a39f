package mps

import (
	"fmt"
	"os"
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestMain lets the test binary stand in for the agent's binary: mode run starts the
// control daemon by re-executing its own binary with ShmStartArg.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShmStartArg {
		fmt.Fprintln(os.Stderr, StartWithPrivateShm(os.Args[2:]))
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// needRoot skips a test that starts a daemon (fails it in CI): mode run makes a mount
// namespace, which needs root (as the agent is).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "starting an MPS daemon needs root (a mount namespace of its own)")
	}
}
