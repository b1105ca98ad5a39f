package gpubridge

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/config"
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

// TestMPSWiring: gpu.mps.mode find gives the GPU loop the daemon and the
// partitions, the NRI plugin the planner and the clients' setup, and the daemon's
// watch runs and stops with the agent; disabled gives none of them.
func TestMPSWiring(t *testing.T) {
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
	cfg := config.Default()
	cfg.GPU.MPS = mps.Config{Mode: mps.ModeFind, PipeDirectory: pipe, ShmDirectory: "/run/mps-shm", ClientUID: 1000,
		ControlBinary: bin, CheckPeriod: metav1.Duration{Duration: 100 * time.Millisecond}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := newGPUMPS(cfg.GPU, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	var o gpu.Options
	m.wire(&o)
	planner, setup := (&Bridge{mps: m}).MPSPlanner(), cfg.GPU.MPSSetup()
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

	offM, err := newGPUMPS(config.Default().GPU, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	var oo gpu.Options
	offM.wire(&oo)
	offPlanner := (&Bridge{mps: offM}).MPSPlanner()
	if oo.MPS != nil || oo.Partitions != nil || oo.OnLever == nil || offPlanner != nil || offM.run(context.Background()) != nil {
		t.Fatalf("mode disabled wired MPS: %+v", oo)
	}
	// GPU features off: the bridge has no gpuMPS at all, so no planner.
	if p := New(Options{}).MPSPlanner(); p != nil {
		t.Fatalf("GPU off: planner %v", p)
	}
	if _, err := newGPUMPS(config.GPU{MPS: mps.Config{Mode: "sometimes"}}, nil, log); err == nil {
		t.Fatal("an invalid gpu.mps.mode was accepted")
	}
}

// TestLeverEvent: a GPU frozen because LS outgrew its MPS partition is a Warning
// Event on each of its batch pods.
func TestLeverEvent(t *testing.T) {
	t.Parallel()
	events := &podEvents{}
	a := &gpuMPS{events: events}
	a.leverEvent(gpu.LeverEvent{GPU: 1, UUID: "GPU-1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b", Reason: qos.GPUReasonMPSCapStale,
		Message:   "LS outgrew its partition; batch frozen until LS is idle or batch restarts",
		BatchPods: []gpu.EventPod{{UID: "b1", Namespace: "ml", Name: "train-1"}, {UID: "b2", Namespace: "ml", Name: "train-2"}}})
	a.leverEvent(gpu.LeverEvent{GPU: 0, Reason: qos.GPUReasonLSUtil, BatchPods: []gpu.EventPod{{UID: "b3", Name: "train-3"}}})
	a.leverEvent(gpu.LeverEvent{GPU: 2, Reason: qos.GPUReasonMPSCapUnconfirmed, BatchPods: []gpu.EventPod{{UID: "b4", Name: "train-4"}}})
	for name, reason := range map[string]string{"train-1": "MPSCapStale", "train-2": "MPSCapStale", "train-3": "GPUFrozen",
		"train-4": "MPSCapUnconfirmed"} {
		if !events.has(name + ": " + reason + ": GPU ") {
			t.Fatalf("%s: events %q; want one %s", name, events.msgs, reason)
		}
	}
	if len(events.msgs) != 4 {
		t.Fatalf("events %q; want one per batch pod", events.msgs)
	}
	(&gpuMPS{}).leverEvent(gpu.LeverEvent{BatchPods: []gpu.EventPod{{UID: "x"}}}) // no sink: no panic
}

// podEvents records Warning events as "pod: reason: message".
type podEvents struct {
	mu   sync.Mutex
	msgs []string
}

func (e *podEvents) Warn(pod *corev1.Pod, reason, message string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.msgs = append(e.msgs, pod.Name+": "+reason+": "+message)
}

// has reports whether an event starts with prefix.
func (e *podEvents) has(prefix string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.ContainsFunc(e.msgs, func(m string) bool { return strings.HasPrefix(m, prefix) })
}
