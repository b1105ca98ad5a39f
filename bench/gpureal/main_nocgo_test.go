//go:build !cgo

package gpureal

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary run as the stand-ins' launcher and the fakes (the dry
// run with the test agent needs cgo: go-nvml's mock).
func TestMain(m *testing.M) {
	if handled, err := Dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); handled {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
