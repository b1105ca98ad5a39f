package gpubridge

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/timeslice"
)

// writeShim writes a stand-in for the shim the agent's image carries.
func writeShim(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), timeslice.LibraryName)
	if err := os.WriteFile(p, []byte("\x7fELF stand-in"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTimesliceWiring: with the gate on the bridge installs the shim under the
// directory and hands the planner to the NRI plugin; off, or without the shim, none or
// a planner that gives no container the shim.
func TestTimesliceWiring(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config.Default()
	if ts, err := newTimeslices(cfg.GPU.Timeslice, log, nil); ts != nil || err != nil || New(Options{}).TimeslicePlanner() != nil {
		t.Fatalf("gate off: %v, %v", ts, err)
	}
	cfg.GPU.Timeslice.Enabled = true
	cfg.GPU.Timeslice.Directory = t.TempDir()
	cfg.GPU.Timeslice.Library = writeShim(t)
	ts, err := newTimeslices(cfg.GPU.Timeslice, log, nil)
	if err != nil || ts == nil {
		t.Fatal(ts, err)
	}
	want := filepath.Join(cfg.GPU.Timeslice.Directory, gpu.TimesliceLibDir, timeslice.LibraryName)
	if ts.Library() != want {
		t.Fatalf("library %q, want %q", ts.Library(), want)
	}
	if b, err := os.ReadFile(want); err != nil || string(b) != "\x7fELF stand-in" {
		t.Fatalf("installed shim: %q, %v", b, err)
	}
	// The image without the shim: the planner runs, gives no container the shim.
	cfg.GPU.Timeslice.Library = filepath.Join(t.TempDir(), "missing.so")
	ts, err = newTimeslices(cfg.GPU.Timeslice, log, nil)
	if err != nil || ts == nil || ts.Library() != "" {
		t.Fatalf("without the shim: %v, %v", ts, err)
	}
	c, ok, err := ts.TimesliceClient(devices.TimesliceRequest{GPUs: []devices.GPU{{Index: 0, UUID: "GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"}},
		PodUID: "u1", Container: "main", Batch: true})
	if ok || err != nil || !strings.Contains(c.Why, "not installed") {
		t.Fatalf("planning without the shim: %+v, %v, %v", c, ok, err)
	}
}
