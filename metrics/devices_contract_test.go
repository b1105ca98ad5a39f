package metrics_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/understory/understory/koordlet/gpu/devices"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/scheduler-extender/placement"
)

// understory.io/gpu-devices is written by the extender and read by both the extender
// (its ledger) and the agent's NRI plugin (the devices a container gets). The two
// parsers live on each side of the wire (neither binary imports the other); this test,
// outside both, holds them to one language: the same strings accepted, as the same
// devices, and the extender's own output read back by the agent.

var devicesCorpus = []string{
	"0", "1,3", " 2 , 5 ", "63", "0,1,2,3,4,5,6,7", "007", "10,2",
	"", " ", ",", "1,", ",1", "1,,2", "64", "100", "0007", "-1", "+1", "1.0", "0x1", "1 2", "1,1", "a",
	"GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "\u0661", "1\t", "\n1",
}

func checkDevicesAgree(t *testing.T, s string) {
	t.Helper()
	ext, extErr := extender.ParseDevices(s)
	agent, agentErr := devices.ParseAnnotation(s)
	switch {
	case (extErr == nil) != (agentErr == nil):
		t.Fatalf("%q: extender %v, %v; agent %v, %v", s, ext, extErr, agent, agentErr)
	case extErr != nil:
		if !errors.Is(extErr, placement.ErrInvalidDevices) || !errors.Is(agentErr, devices.ErrMalformed) {
			t.Fatalf("%q: errors %v / %v wrap no sentinel", s, extErr, agentErr)
		}
	case !slices.Equal(ext, agent):
		t.Fatalf("%q: extender reads %v, agent %v", s, ext, agent)
	default:
		back, err := devices.ParseAnnotation(extender.FormatDevices(ext))
		if err != nil || !slices.Equal(back, ext) {
			t.Fatalf("%q: the extender's rendering %q reads back as %v, %v", s, extender.FormatDevices(ext), back, err)
		}
	}
}

func TestDevicesAnnotationParsersAgree(t *testing.T) {
	t.Parallel()
	for _, s := range devicesCorpus {
		checkDevicesAgree(t, s)
	}
}

func FuzzDevicesAnnotationParsersAgree(f *testing.F) {
	for _, s := range devicesCorpus {
		f.Add(s)
	}
	f.Fuzz(checkDevicesAgree)
}
