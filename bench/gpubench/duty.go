package gpubench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/gpu/duty"
)

// Freezers the duty part can measure.
const (
	freezerV1 = "v1" // the v1 freezer hierarchy (freezer.state), as on v1 and hybrid nodes
	freezerV2 = "v2" // cgroup2 cgroup.freeze (the unified hierarchy of a hybrid node, or v2)
)

// burnerScript stands in for a GPU process's CPU thread: one thread, always runnable
// unless frozen, so /proc/<pid>/schedstat's run and run-queue wait describe it exactly.
const burnerScript = "while :; do :; done"

// errUnavailable: the freezer cannot be measured on this machine (the reason follows).
var errUnavailable = errors.New("freezer not available")

// DutyConfig sizes the duty part.
type DutyConfig struct {
	CgroupRoot string
	Period     time.Duration
	// Point is the duty-cycled time per duty; as long again is spent unfrozen.
	Point time.Duration
	// Window is one measured window, a multiple of Period.
	Window   time.Duration
	Duties   []float64
	Freezers []string
}

// MarshalJSON writes durations in readable units.
func (c DutyConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		CgroupRoot string    `json:"cgroup_root"`
		PeriodMs   float64   `json:"period_ms"`
		PointS     float64   `json:"point_s"`
		WindowMs   float64   `json:"window_ms"`
		Duties     []float64 `json:"duties"`
		Freezers   []string  `json:"freezers"`
	}{c.CgroupRoot, ms(c.Period), c.Point.Seconds(), ms(c.Window), c.Duties, c.Freezers})
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (c DutyConfig) validate() error {
	if c.Period < duty.MinPeriod || c.Period > duty.MaxPeriod {
		return fmt.Errorf("-period %v not in [%v, %v]", c.Period, duty.MinPeriod, duty.MaxPeriod)
	}
	if c.Window < c.Period || c.Window%c.Period != 0 {
		return fmt.Errorf("-window %v must be a whole number of periods (%v)", c.Window, c.Period)
	}
	if c.Point < c.Window {
		return fmt.Errorf("-point %v must be at least one window (%v)", c.Point, c.Window)
	}
	if len(c.Freezers) == 0 {
		return errors.New("-freezers: none given")
	}
	for i, f := range c.Freezers {
		if f != freezerV1 && f != freezerV2 {
			return fmt.Errorf("-freezers: %q is neither %s nor %s", f, freezerV1, freezerV2)
		}
		if slices.Contains(c.Freezers[:i], f) {
			return fmt.Errorf("-freezers: %s given twice", f)
		}
	}
	if c.CgroupRoot == "" {
		return errors.New("-cgroup-root: empty")
	}
	return nil
}

// dutyRun is one freezer's measurement.
type dutyRun struct {
	Freezer string      `json:"freezer"`
	Root    string      `json:"root"`
	Points  []dutyPoint `json:"points"`
}

// dutyPoint is one duty cycle's measurement.
type dutyPoint struct {
	Target float64 `json:"target"`
	// FrozenPct is the share of its unfrozen CPU the burner lost: 100 * (1 - CPU rate in
	// the duty-cycled windows / CPU rate in the unfrozen baseline windows). ErrorPct is
	// |FrozenPct - 100*Target|, the headline.
	FrozenPct float64 `json:"frozen_pct"`
	ErrorPct  float64 `json:"error_pct"`
	// RunnableFrozenPct is the frozen share by the scheduler's account: 100 * (1 - (run +
	// run-queue wait) / wall) in the duty-cycled windows; a busy loop is runnable whenever
	// it is not frozen, so other load on the machine does not move it.
	RunnableFrozenPct float64 `json:"runnable_frozen_pct"`
	RunnableErrorPct  float64 `json:"runnable_error_pct"`
	// BaselineCPUs is the burner's CPU rate unfrozen; RunQueueWaitPct the share of its
	// runnable time it waited for a CPU. High waits mean other load, and a noisier
	// FrozenPct.
	BaselineCPUs    float64 `json:"baseline_cpus"`
	RunQueueWaitPct float64 `json:"run_queue_wait_pct"`
	// Windows is the number of duty-cycled windows (as many baseline ones).
	Windows int `json:"windows"`
	// Warning says when other load made FrozenPct unreliable.
	Warning string `json:"warning,omitempty"`
}

// runDuty measures every configured freezer that this machine has. The first one
// measured gives the headline figures.
func runDuty(ctx context.Context, cfg DutyConfig, printf func(string, ...any)) ([]dutyRun, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the duty bench creates cgroups and moves a process into them: run it as root")
	}
	var runs []dutyRun
	var skipped []string
	for _, f := range cfg.Freezers {
		run, err := measureFreezer(ctx, cfg, f, printf)
		if errors.Is(err, errUnavailable) {
			printf("skipping %s: %v\n", f, err)
			skipped = append(skipped, err.Error())
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s freezer: %w", f, err)
		}
		runs = append(runs, run)
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("no freezer to measure: %s", strings.Join(skipped, "; "))
	}
	return runs, nil
}

// busyWaitPct: above this run-queue wait, other load moves FrozenPct (see dutyPoint).
const busyWaitPct = 10

// freezerGroup makes a uniquely named group for freezer f under root, and returns it
// with the hierarchy root it is in and the directories to thaw in a cleanup.
func freezerGroup(root, f string) (g *cgroups.Group, hroot string, thawDirs []string, err error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return nil, "", nil, err
	}
	rel := "understory-gpu-bench-" + hex.EncodeToString(b)
	switch f {
	case freezerV1:
		h, err := cgroups.Open(root)
		if err != nil {
			return nil, "", nil, fmt.Errorf("%w: %w", errUnavailable, err)
		}
		if h.Layout() == cgroups.LayoutV2 || !isDir(filepath.Join(root, "freezer")) {
			return nil, "", nil, fmt.Errorf("%w: no v1 freezer hierarchy at %s/freezer (layout %v)", errUnavailable, root, h.Layout())
		}
		g, err := h.Create(rel)
		if err != nil {
			return nil, "", nil, err
		}
		return g, root, []string{filepath.Join(root, "freezer", rel), filepath.Join(root, "unified", rel)}, nil
	default:
		unified := filepath.Join(root, "unified")
		if isFile(filepath.Join(root, "cgroup.controllers")) {
			unified = root
		}
		if !isFile(filepath.Join(unified, "cgroup.controllers")) {
			return nil, "", nil, fmt.Errorf("%w: no cgroup2 hierarchy at %s", errUnavailable, unified)
		}
		h, err := cgroups.Open(unified)
		if err != nil {
			return nil, "", nil, fmt.Errorf("%w: %w", errUnavailable, err)
		}
		// Not Create: it enables +cpu along the path, which a hybrid node's
		// controller-less unified hierarchy refuses; cgroup.freeze needs no controller.
		if err := os.Mkdir(filepath.Join(unified, rel), 0o755); err != nil {
			return nil, "", nil, err
		}
		g, err := h.Load(rel)
		if err != nil {
			_ = os.Remove(filepath.Join(unified, rel))
			return nil, "", nil, err
		}
		return g, unified, []string{filepath.Join(unified, rel)}, nil
	}
}

// startBurner starts the CPU burner in g (a new group of freezerGroup, with its freezer
// directories thawDirs). cleanup thaws the group, kills the burner and removes the group;
// on error startBurner has done that itself.
func startBurner(g *cgroups.Group, thawDirs []string) (pid int, cleanup func() error, err error) {
	burner := exec.Command("/bin/sh", "-c", burnerScript)
	burner.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := false
	cleanup = func() error {
		// A frozen v1 task does not die: thaw first, then kill, then remove.
		for _, d := range thawDirs {
			_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
			_ = os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0)
		}
		if started {
			_ = burner.Process.Kill()
			_ = burner.Wait()
		}
		var derr error
		for range 100 {
			if derr = g.Delete(); derr == nil {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return fmt.Errorf("removing the bench cgroup %s: %w", g.Path(), derr)
	}
	if err := burner.Start(); err != nil {
		return 0, nil, errors.Join(fmt.Errorf("starting the burner: %w", err), cleanup())
	}
	started = true
	if err := g.AddProc(burner.Process.Pid); err != nil {
		return 0, nil, errors.Join(err, cleanup())
	}
	return burner.Process.Pid, cleanup, nil
}

// measureFreezer runs the burner in a new group of freezer f, duty-cycles it at each
// duty, and removes everything it made, also on error or interrupt.
func measureFreezer(ctx context.Context, cfg DutyConfig, f string, printf func(string, ...any)) (run dutyRun, err error) {
	g, hroot, thawDirs, err := freezerGroup(cfg.CgroupRoot, f)
	if err != nil {
		return dutyRun{}, err
	}
	pid, cleanup, err := startBurner(g, thawDirs)
	if err != nil {
		return dutyRun{}, err
	}
	defer func() {
		if cerr := cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	c, err := duty.New(cfg.Period, nil)
	if err != nil {
		return dutyRun{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		cancel()
		if rerr := <-done; rerr != nil && err == nil {
			err = rerr
		}
	}()

	run = dutyRun{Freezer: f, Root: hroot}
	rounds := max(int(cfg.Point/cfg.Window), 1)
	for _, d := range cfg.Duties {
		p, err := measurePoint(ctx, c, g, pid, d, cfg.Window, rounds)
		if err != nil {
			return dutyRun{}, err
		}
		printf("%s duty %2.0f %%: frozen %5.1f %% of its unfrozen CPU (error %.2f points), %5.1f %% by the "+
			"scheduler's account (error %.2f); baseline %.2f CPUs, run-queue wait %.1f %%\n",
			f, d*100, p.FrozenPct, p.ErrorPct, p.RunnableFrozenPct, p.RunnableErrorPct, p.BaselineCPUs, p.RunQueueWaitPct)
		if p.Warning != "" {
			printf("  warning: %s\n", p.Warning)
		}
		run.Points = append(run.Points, p)
	}
	return run, nil
}

// measurePoint alternates baseline (unfrozen) and duty-cycled windows, ABBA so that a
// trend in the machine's load cancels. Duty-cycled windows start at a period start after
// the rise from 0 (whose first window is off the period clock) and last whole periods.
func measurePoint(ctx context.Context, c *duty.Cycler, g *cgroups.Group, pid int, d float64, window time.Duration,
	rounds int) (dutyPoint, error) {
	var baseRun, baseWait, baseWall, cycRun, cycWait, cycWall time.Duration
	measure := func(from time.Time, run, wait, wall *time.Duration) error {
		if err := sleepUntil(ctx, from); err != nil {
			return err
		}
		r0, w0, err := schedstat(pid)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := sleepUntil(ctx, from.Add(window)); err != nil {
			return err
		}
		r1, w1, err := schedstat(pid)
		if err != nil {
			return err
		}
		*wall += time.Since(t0)
		*run += r1 - r0
		*wait += w1 - w0
		return nil
	}
	baseline := func() error {
		if err := waitThawed(ctx, g); err != nil {
			return err
		}
		return measure(time.Now(), &baseRun, &baseWait, &baseWall)
	}
	cycled := func() error {
		if err := c.Set("bench", []*cgroups.Group{g}, d); err != nil {
			return err
		}
		err := measure(c.NextPeriod(time.Now()), &cycRun, &cycWait, &cycWall)
		if serr := c.Set("bench", nil, 0); err == nil {
			err = serr
		}
		return err
	}
	for r := range rounds {
		first, second := baseline, cycled
		if r%2 == 1 {
			first, second = cycled, baseline
		}
		if err := first(); err != nil {
			return dutyPoint{}, err
		}
		if err := second(); err != nil {
			return dutyPoint{}, err
		}
	}
	p := dutyPoint{Target: d, Windows: rounds}
	if baseRun <= 0 || cycWall <= 0 {
		return dutyPoint{}, fmt.Errorf("the burner got no CPU unfrozen (%v in %v)", baseRun, baseWall)
	}
	p.BaselineCPUs = baseRun.Seconds() / baseWall.Seconds()
	p.FrozenPct = 100 * (1 - (cycRun.Seconds()/cycWall.Seconds())/p.BaselineCPUs)
	p.ErrorPct = math.Abs(p.FrozenPct - 100*d)
	p.RunnableFrozenPct = 100 * (1 - (cycRun+cycWait).Seconds()/cycWall.Seconds())
	p.RunnableErrorPct = math.Abs(p.RunnableFrozenPct - 100*d)
	if all := baseRun + baseWait + cycRun + cycWait; all > 0 {
		p.RunQueueWaitPct = 100 * (baseWait + cycWait).Seconds() / all.Seconds()
	}
	if p.RunQueueWaitPct > busyWaitPct {
		p.Warning = fmt.Sprintf("the machine was busy (the burner waited for a CPU %.0f %% of its runnable time): "+
			"frozen_pct and error_pct are unreliable, run the bench on an idle machine", p.RunQueueWaitPct)
	}
	return p, nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// waitThawed waits (at most 5 s) for the cycler's thaw after Set(0).
func waitThawed(ctx context.Context, g *cgroups.Group) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := g.Frozen()
		if err != nil {
			return err
		}
		if !f {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still frozen 5 s after its duty went to 0", g.Path())
		}
		if err := sleepUntil(ctx, time.Now().Add(time.Millisecond)); err != nil {
			return err
		}
	}
}

// schedstat returns the CPU time of pid's threads and their time runnable on a run queue
// without running, from /proc/<pid>/task/*/schedstat (nanoseconds).
func schedstat(pid int) (run, wait time.Duration, err error) {
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil {
		return 0, 0, err
	}
	if len(files) == 0 {
		return 0, 0, fmt.Errorf("burner %d: no /proc/%d/task/*/schedstat (exited?)", pid, pid)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that exited
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return 0, 0, fmt.Errorf("%s: malformed %q", p, b)
		}
		r, err1 := strconv.ParseInt(f[0], 10, 64)
		w, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("%s: malformed %q", p, b)
		}
		run += time.Duration(r)
		wait += time.Duration(w)
	}
	return run, wait, nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
