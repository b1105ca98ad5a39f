package cgroups

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"
)

// DefaultFreezeTimeout bounds Freeze and Thaw. A task stuck in
// uninterruptible sleep (D state, e.g. on NFS or a hung device) keeps a v1
// freezer in FREEZING indefinitely; containerd/cgroups' own Freeze would spin
// forever, so the wait here is bounded and ctx-aware.
const DefaultFreezeTimeout = 5 * time.Second

const (
	fileFreezerState = "freezer.state"
	fileFreeze       = "cgroup.freeze"
	fileEvents       = "cgroup.events"
)

// Freeze stops every task in the group and its descendants and waits until
// the kernel reports them frozen (at most DefaultFreezeTimeout). v1 (and
// hybrid with a v1 freezer): freezer.state FROZEN, re-requested while it
// reads FREEZING. v2 (and hybrid without a v1 freezer): cgroup.freeze=1,
// then cgroup.events "frozen 1". On timeout the error wraps ErrTimeout and
// the group may be partly frozen; call Thaw to undo.
func (g *Group) Freeze() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultFreezeTimeout)
	defer cancel()
	return g.FreezeContext(ctx)
}

// Thaw resumes the group's tasks (bounded like Freeze).
func (g *Group) Thaw() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultFreezeTimeout)
	defer cancel()
	return g.ThawContext(ctx)
}

// FreezeContext is Freeze with the wait bounded by ctx instead.
func (g *Group) FreezeContext(ctx context.Context) error { return g.setFrozen(ctx, true) }

// ThawContext is Thaw with the wait bounded by ctx instead.
func (g *Group) ThawContext(ctx context.Context) error { return g.setFrozen(ctx, false) }

// Frozen reports whether the group is completely frozen (a v1 group still
// FREEZING is not).
func (g *Group) Frozen() (bool, error) {
	if g.useV1Freezer() {
		s, err := g.v1FreezerState()
		return s == "FROZEN", err
	}
	dir, err := g.v2FreezerDir()
	if err != nil {
		return false, err
	}
	return readEventsFrozen(dir)
}

func (g *Group) useV1Freezer() bool {
	return g.h.layout != LayoutV2 && g.h.freezerDir != ""
}

func (g *Group) freezerDir() string { return g.h.freezerDir + "/" + g.rel }

func (g *Group) v1FreezerState() (string, error) {
	b, err := readFile(g.freezerDir(), fileFreezerState)
	if err != nil {
		return "", err
	}
	s := string(bytes.TrimSpace(b))
	switch s {
	case "FROZEN", "FREEZING", "THAWED":
		return s, nil
	}
	return "", classifyMalformed(g.freezerDir(), fileFreezerState, fmt.Errorf("unknown state %q", s))
}

// v2FreezerDir returns the cgroup2 directory used for freezing, or
// ErrUnsupported when there is none (v1 without freezer).
func (g *Group) v2FreezerDir() (string, error) {
	d := g.unifiedDir()
	if d == "" || g.v2 == nil {
		if g.h.layout == LayoutV1 {
			return "", fmt.Errorf("freezing cgroup %s: no v1 freezer hierarchy: %w", g.rel, ErrUnsupported)
		}
		return "", fmt.Errorf("freezing cgroup %s: no unified group (call Create): %w", g.rel, ErrNotExist)
	}
	return d, nil
}

func (g *Group) setFrozen(ctx context.Context, frozen bool) error {
	op := "thawing"
	if frozen {
		op = "freezing"
	}
	if g.useV1Freezer() {
		want := "THAWED"
		if frozen {
			want = "FROZEN"
		}
		return poll(ctx, func() (bool, string, error) {
			// Re-writing FROZEN while FREEZING retries tasks that could not
			// be frozen yet.
			if err := writeFile(g.freezerDir(), fileFreezerState, want); err != nil {
				return false, "", err
			}
			s, err := g.v1FreezerState()
			return s == want, s, err
		}, op, g.rel)
	}
	dir, err := g.v2FreezerDir()
	if err != nil {
		return err
	}
	if err := requireFile(dir, fileFreeze); err != nil {
		return err
	}
	if frozen {
		err = g.v2.Freeze()
	} else {
		err = g.v2.Thaw()
	}
	if err != nil {
		return classify(op, dir, fileFreeze, err)
	}
	return poll(ctx, func() (bool, string, error) {
		f, err := readEventsFrozen(dir)
		return f == frozen, fmt.Sprintf("frozen %t", f), err
	}, op, g.rel)
}

// poll calls check until it reports done, an error, or ctx ends (ErrTimeout),
// backing off from 1 ms to 20 ms.
func poll(ctx context.Context, check func() (done bool, state string, err error), op, rel string) error {
	delay := time.Millisecond
	for {
		done, state, err := check()
		if err != nil || done {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s cgroup %s: still %q: %w: %w", op, rel, state, ErrTimeout, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// readEventsFrozen reads the "frozen" key of cgroup.events (kernel >= 5.2).
func readEventsFrozen(dir string) (bool, error) {
	b, err := readFile(dir, fileEvents)
	if err != nil {
		return false, err
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || k != "frozen" {
			continue
		}
		switch strings.TrimSpace(v) {
		case "1":
			return true, nil
		case "0":
			return false, nil
		}
		return false, classifyMalformed(dir, fileEvents, fmt.Errorf("frozen %q", v))
	}
	return false, fmt.Errorf("reading %s/%s: no \"frozen\" key: %w", dir, fileEvents, ErrUnsupported)
}
