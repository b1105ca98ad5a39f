//go:build cgo

package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary run as the stand-ins' launcher, the fakes and the test
// agent, as the driver re-executes them.
func TestMain(m *testing.M) {
	if os.Getenv(testAgentEnv) == "1" {
		os.Exit(runTestAgent(os.Args[1:]))
	}
	if handled, err := dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); handled {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
