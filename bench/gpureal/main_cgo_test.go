//go:build cgo

package gpureal

import (
	"fmt"
	"os"
	"testing"

	"github.com/understory/understory/koordlet/gpu/mps"
)

// TestMain lets the test binary run as the stand-ins' launcher, the fakes and the test
// agent, as the driver re-executes them.
func TestMain(m *testing.M) {
	// The test agent's MPS daemon start (gpu.mps.mode run) re-executes the test binary,
	// as bin/koordlet re-executes itself.
	if len(os.Args) > 1 && os.Args[1] == mps.ShmStartArg {
		fmt.Fprintln(os.Stderr, mps.StartWithPrivateShm(os.Args[2:]))
		os.Exit(1)
	}
	if os.Getenv(testAgentEnv) == "1" {
		os.Exit(runTestAgent(os.Args[1:]))
	}
	if handled, err := Dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); handled {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
