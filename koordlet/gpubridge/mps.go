package gpubridge

import (
	"context"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

// gpuMPS holds what the agent needs for NVIDIA MPS: the node's MPS control daemon and
// the partitions the NRI plugin plans clients with (gpu.mps.mode find or run; both nil
// when disabled), and the recorder that turns the GPU loop's lever changes into Events.
// They live together so that the agent wires them into the GPU loop and the NRI plugin
// from one place.
type gpuMPS struct {
	daemon     *mps.Daemon
	partitions *gpu.Partitions
	events     EventRecorder
	log        *slog.Logger
}

// newGPUMPS builds the MPS part of the agent for cfg: the daemon and partitions when
// gpu.mps.mode is find or run, only the lever Events otherwise.
func newGPUMPS(cfg config.GPU, events EventRecorder, log *slog.Logger) (*gpuMPS, error) {
	m := &gpuMPS{events: events, log: log}
	if cfg.MPS.Mode == "" || cfg.MPS.Mode == mps.ModeDisabled {
		return m, nil
	}
	d, err := mps.New(cfg.MPS, log.With("component", "gpu-mps"))
	if err != nil {
		return nil, fmt.Errorf("gpu.mps: %w", err)
	}
	m.daemon, m.partitions = d, gpu.NewPartitions(cfg.Throttle.MPS)
	return m, nil
}

// wire gives the GPU loop the daemon, the partitions and the lever Events.
func (m *gpuMPS) wire(o *gpu.Options) {
	o.OnLever = m.leverEvent
	if m.daemon != nil {
		o.MPS, o.Partitions = m.daemon, m.partitions
	}
}

// run runs the daemon's watch (mode run: it starts one) in its own goroutine; the
// returned func stops it (mode run: quitting a daemon the agent started) and waits.
// Nil without MPS.
func (m *gpuMPS) run(ctx context.Context) (stop func()) {
	if m.daemon == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.daemon.Run(ctx); err != nil {
			m.log.Error("MPS control daemon watch stopped; GPU containers start without MPS", "err", err)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// planner is the NRI plugin's MPS client planner: the partitions, or nil without MPS.
func (m *gpuMPS) planner() devices.MPSPlanner {
	if m.partitions == nil {
		return nil
	}
	return m.partitions
}

// leverEvent records a GPU lever change (batch frozen because LS outgrew its MPS
// partition, or because a batch client's MPS cap could not be confirmed) as a Warning Event on each of the GPU's batch pods. The GPU loop calls
// it; the event sinks do not block.
func (m *gpuMPS) leverEvent(ev gpu.LeverEvent) {
	if m.events == nil {
		return
	}
	reason := "GPUFrozen"
	switch ev.Reason {
	case qos.GPUReasonMPSCapStale:
		reason = "MPSCapStale"
	case qos.GPUReasonMPSCapUnconfirmed:
		reason = "MPSCapUnconfirmed"
	}
	for _, p := range ev.BatchPods {
		m.events.Warn(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: p.UID, Namespace: p.Namespace, Name: p.Name}},
			reason, fmt.Sprintf("GPU %d (%s): %s", ev.GPU, ev.UUID, ev.Message))
	}
}
