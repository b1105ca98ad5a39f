package colo

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/koordlet/signals/runqlat"
)

// onsetWatch tells when LS harm begins in a reaction step, independently of the agent:
// a run-queue delay probe of the bench's own (the agent loads another) on the LS pod's
// cgroup, read every onsetPoll. The harm rule is the agent's (signals' defaults): the
// delays of the last onsetWindow (whole windows only) number at least
// DefaultRunqueueMinSamples and their DefaultRunqueueQuantile lies in a bucket at or
// above DefaultRunqueueThreshold. The agent judges windows of one to a few poll
// intervals (20 ms), so it may see harm before this 50 ms window shows it: a reaction
// timed from here counts such a cut as 0. Where the probe attributes (tp_btf, Linux
// 5.15+), harm is also the agent's: batch's slow delays alone put the quantile past the
// threshold (signals.RunqueueHarm's batchOnly), since the agent leaves alone harm batch
// did not cause.
type onsetWatch struct {
	p  *runqlat.Probe
	id uint64
	// batch: harm must be batch's (the probe attributes).
	batch bool
}

const (
	onsetPoll   = 5 * time.Millisecond
	onsetWindow = 50 * time.Millisecond
)

// errNoOnset: the machine cannot load the probe (no BPF, no cgroup2); reactions are then
// timed from the step only.
var errNoOnset = errors.New("no run-queue delay probe for the bench")

// newOnsetWatch loads the probe and watches the LS pod cgroup rel (relative to the
// hierarchy's root) in the cgroup2 tree: the root itself on a unified host, its
// "unified" directory on a hybrid one.
func newOnsetWatch(h *cgroups.Hierarchy, rel string) (*onsetWatch, error) {
	dir := filepath.Join(h.Root(), rel)
	if h.Layout() != cgroups.LayoutV2 {
		dir = filepath.Join(h.Root(), "unified", rel)
	}
	id, err := runqlat.CgroupID(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoOnset, err)
	}
	p, err := runqlat.Load(runqlat.Options{MaxCgroups: 4})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoOnset, err)
	}
	// The threshold makes the kernel count batch's slow delays (Histogram.Batch).
	err = p.SetThreshold(signals.SlowThreshold(signals.DefaultRunqueueThreshold))
	if err == nil {
		err = p.Watch(id)
	}
	if err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("%w: %w", errNoOnset, err)
	}
	return &onsetWatch{p: p, id: id, batch: p.Attributes()}, nil
}

func (w *onsetWatch) close() { _ = w.p.Close() }

// first reads until ctx ends and returns how long after t0 the first harmed window ended
// (ok false: none). A read that fails ends the watch without an onset.
func (w *onsetWatch) first(ctx context.Context, t0 time.Time) (time.Duration, bool) {
	type snap struct {
		at time.Time
		h  runqlat.Histogram
	}
	var hist []snap // oldest first, spanning at least onsetWindow once full
	buf := map[uint64]runqlat.Histogram{}
	tk := time.NewTicker(onsetPoll)
	defer tk.Stop()
	for {
		clear(buf)
		if err := w.p.Read(buf); err != nil {
			return 0, false
		}
		now := time.Now()
		h := buf[w.id]
		hist = append(hist, snap{now, h})
		// Drop snapshots older than the window, keeping one at or before its start.
		for len(hist) > 1 && now.Sub(hist[1].at) >= onsetWindow {
			hist = hist[1:]
		}
		// Only whole windows: over the first milliseconds of a step a handful of
		// delays make a 99th percentile of one slow delay.
		if now.Sub(hist[0].at) >= onsetWindow && harmed(h.Sub(hist[0].h), w.batch) {
			return now.Sub(t0), true
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-tk.C:
		}
	}
}

// harmed applies the agent's rule, with its defaults, to the delays d; with batch only
// batch's slow delays count.
func harmed(d runqlat.Histogram, batch bool) bool {
	_, h := signals.RunqueueHarm(d, signals.DefaultRunqueueQuantile, signals.DefaultRunqueueThreshold,
		signals.DefaultRunqueueMinSamples, batch)
	return h
}
