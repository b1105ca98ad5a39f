package psi

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/cgroups/cgroupstest"
	"golang.org/x/sys/unix"
)

// helperEnv turns the test binary into a helper process for the real
// tests (re-exec of os.Args[0]): "burn:<cpu>" spins one thread pinned to
// that CPU (-1: unpinned), "sleep" sleeps. Either exits by itself after
// helperMaxLife, so a crashed test never leaves it behind; the tests also
// kill it and set Pdeathsig.
const (
	helperEnv     = "UNDERSTORY_PSI_TEST_HELPER"
	helperMaxLife = 30 * time.Second
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		if err := helper(spec); err != nil {
			fmt.Fprintln(os.Stderr, "psi test helper:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helper(spec string) error {
	if spec == "sleep" {
		time.Sleep(helperMaxLife)
		return nil
	}
	cpuStr, ok := strings.CutPrefix(spec, "burn:")
	if !ok {
		return fmt.Errorf("unknown helper %q", spec)
	}
	cpu, err := strconv.Atoi(cpuStr)
	if err != nil {
		return err
	}
	// Affinity is per thread: pin the thread that spins.
	runtime.LockOSThread()
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("pinning to cpu %d: %w", cpu, err)
		}
	}
	cgroupstest.Burn(helperMaxLife)
	return nil
}
