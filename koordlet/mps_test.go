package koordlet

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

// A control binary that answers while $CUDA_MPS_PIPE_DIRECTORY/alive exists.
const fakeMPSControl = `#!/bin/sh
read -r cmd
[ -e "$CUDA_MPS_PIPE_DIRECTORY/alive" ] || exit 1
echo 1
`

// TestAgentMPSWiring: gpu.mps.mode find gives the GPU loop the daemon and the
// partitions, the NRI plugin the planner and the clients' setup, and the daemon's
// watch runs and stops with the agent; disabled gives none of them.
func TestAgentMPSWiring(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(bin, []byte(fakeMPSControl), 0o755); err != nil {
		t.Fatal(err)
	}
	pipe := filepath.Join(dir, "pipe")
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"alive", "control"} {
		if err := os.WriteFile(filepath.Join(pipe, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The control socket: a FIFO stands in for it.
	if err := os.Remove(filepath.Join(pipe, "control")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(pipe, "control"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.GPU.MPS = mps.Config{Mode: mps.ModeFind, PipeDirectory: pipe, ShmDirectory: "/run/mps-shm", ClientUID: 1000,
		ControlBinary: bin, CheckPeriod: metav1.Duration{Duration: 100 * time.Millisecond}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := newGPUMPS(cfg.GPU, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: cfg, log: log, gpu: &gpuBridge{mps: m}}
	var o gpu.Options
	m.wire(&o)
	planner, setup := a.MPSOptions()
	if o.MPS == nil || o.Partitions == nil || o.OnLever == nil || planner == nil {
		t.Fatalf("mode find: options %+v, planner %v", o, planner)
	}
	if setup != (devices.MPSSetup{ShmDir: "/run/mps-shm", ClientUID: 1000}) {
		t.Fatalf("MPS setup = %+v", setup)
	}
	stop := m.run(context.Background())
	testenv.WaitFor(t, 10*time.Second, "the daemon's watch to find the daemon", m.daemon.Ready)
	stop()
	if m.daemon.Ready() {
		t.Fatal("ready after the watch stopped")
	}

	offM, err := newGPUMPS(DefaultConfig().GPU, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	var oo gpu.Options
	offM.wire(&oo)
	offPlanner, _ := (&Agent{cfg: DefaultConfig(), gpu: &gpuBridge{mps: offM}}).MPSOptions()
	if oo.MPS != nil || oo.Partitions != nil || oo.OnLever == nil || offPlanner != nil || offM.run(context.Background()) != nil {
		t.Fatalf("mode disabled wired MPS: %+v", oo)
	}
	// GPU features off: the agent has no gpuMPS at all, so no planner.
	if p, s := (&Agent{cfg: DefaultConfig()}).MPSOptions(); p != nil || s.ShmDir == "" {
		t.Fatalf("GPU off: planner %v, setup %+v", p, s)
	}
	if _, err := newGPUMPS(GPUConfig{MPS: mps.Config{Mode: "sometimes"}}, nil, log); err == nil {
		t.Fatal("an invalid gpu.mps.mode was accepted")
	}
}

// TestLeverEvent: a GPU frozen because LS outgrew its MPS partition is a Warning
// Event on each of its batch pods.
func TestLeverEvent(t *testing.T) {
	t.Parallel()
	events := &nriEvents{}
	a := &gpuMPS{events: events}
	a.leverEvent(gpu.LeverEvent{GPU: 1, UUID: nriUUID1, Reason: qos.GPUReasonMPSCapStale,
		Message:   "LS outgrew its partition; batch frozen until LS is idle or batch restarts",
		BatchPods: []gpu.EventPod{{UID: "b1", Namespace: "ml", Name: "train-1"}, {UID: "b2", Namespace: "ml", Name: "train-2"}}})
	a.leverEvent(gpu.LeverEvent{GPU: 0, Reason: qos.GPUReasonLSUtil, BatchPods: []gpu.EventPod{{UID: "b3"}}})
	a.leverEvent(gpu.LeverEvent{GPU: 2, Reason: qos.GPUReasonMPSCapUnconfirmed, BatchPods: []gpu.EventPod{{UID: "b4"}}})
	for uid, reason := range map[string]string{"b1": "MPSCapStale", "b2": "MPSCapStale", "b3": "GPUFrozen",
		"b4": "MPSCapUnconfirmed"} {
		evs := events.forPod(uid)
		if len(evs) != 1 || evs[0].reason != reason || !strings.HasPrefix(evs[0].message, "GPU ") {
			t.Fatalf("%s: events %+v; want one %s", uid, evs, reason)
		}
	}
	(&gpuMPS{}).leverEvent(gpu.LeverEvent{BatchPods: []gpu.EventPod{{UID: "x"}}}) // no sink: no panic
}
