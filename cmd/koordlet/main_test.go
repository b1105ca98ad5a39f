package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/understory/understory/koordlet/config"
)

// An agent without GPU features on a node whose PCI bus has NVIDIA GPUs says so in
// its log and understory_gpu_unmanaged; with GPU features, or GPU mode off, or no
// NVIDIA GPU, it reports 0 and says nothing.
func TestReportUnmanagedGPUs(t *testing.T) {
	t.Parallel()
	sys := t.TempDir()
	for addr, vc := range map[string][2]string{"0000:18:00.0": {"0x10de", "0x030200"}, "0000:19:00.0": {"0x10de", "0x030200"},
		"0000:00:1f.0": {"0x8086", "0x060100"}} {
		dir := filepath.Join(sys, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, v := range map[string]string{"vendor": vc[0], "class": vc[1]} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	on := config.Default()
	off := config.Default()
	off.GPU.Mode = config.GPUModeOff
	for _, tc := range []struct {
		name   string
		cfg    config.Config
		gpuOff bool
		sys    string
		want   string
	}{
		{"no GPU features, two GPUs", on, true, sys, "2"},
		{"GPU features on", on, false, sys, "0"},
		{"GPU mode off by choice", off, true, sys, "0"},
		{"no GPUs", on, true, t.TempDir(), "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			reg := prometheus.NewPedanticRegistry()
			if err := reportUnmanagedGPUs(tc.cfg, tc.gpuOff, tc.sys, reg, nil, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
				t.Fatal(err)
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP understory_gpu_unmanaged NVIDIA GPUs on the node's PCI bus that the agent cannot manage (GPU features off here): label the node nvidia.com/gpu.present=true so that the GPU agent runs there.
# TYPE understory_gpu_unmanaged gauge
understory_gpu_unmanaged `+tc.want+"\n"), "understory_gpu_unmanaged"); err != nil {
				t.Error(err)
			}
			warned := strings.Contains(logs.String(), "GPUs unmanaged") && strings.Contains(logs.String(), "0000:18:00.0, 0000:19:00.0")
			if warned != (tc.want != "0") {
				t.Errorf("log %q; want a warning naming both GPUs: %v", logs.String(), tc.want != "0")
			}
		})
	}
}
