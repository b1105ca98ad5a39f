package gpureal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
)

// Workload roles.
const (
	roleLS    = "ls"
	roleBatch = batchShallow
	roleDeep  = batchDeep
)

// options are the run's settings (main.go fills them from flags).
type options struct {
	Plan       planConfig
	Out        string
	LogDir     string
	CgroupRoot string
	// AgentCmd is the agent's argv before "-config FILE"; AgentEnv extra environment.
	AgentCmd []string
	// ProfileAgent: the agent serves /debug/pprof (AgentCmd has -pprof); a CPU profile of
	// each steady agent phase goes to LogDir.
	ProfileAgent bool
	AgentEnv     []string
	// AgentConfigExtra is merged over the agent's config (agentConfigSpec.Extra).
	AgentConfigExtra map[string]map[string]any
	// Self is this binary (the launcher and the fakes).
	Self      string
	Python    string
	Workloads string
	Fake      bool
	// FakeLSWork and FakeBatchWork are the fakes' CPU time per request and per matmul.
	FakeLSWork, FakeBatchWork time.Duration
	MPS                       string
	// MPSPipe is the MPS section's pipe directory (default: a fresh one of the run's, so
	// that only the bench's containers are the daemon's clients).
	MPSPipe                   string
	LSRate                    float64
	LSMatmuls, LSSize         int
	BatchSize                 int
	BatchEvery, DeepEvery     int
	LSGPUMilli, BatchGPUMilli int
	ReadyTimeout              time.Duration
	Stdout                    io.Writer
}

func (o *options) every(role string) int {
	if role == roleDeep {
		return o.DeepEvery
	}
	return o.BatchEvery
}

// bench is one run's state.
type bench struct {
	o       *options
	node    *node
	rt      *nriRuntime
	tmp     string
	res     *result
	wlog    io.Writer // the stand-ins' stderr
	printf  func(string, ...any)
	section *sectionRun
}

// sectionRun is the state of the section in progress.
type sectionRun struct {
	info    *sectionInfo
	agent   *agentProc
	mpsPipe string
	// standInUID is the user the section's stand-ins run as (and the runtime reports to
	// NRI): mpsClientUID in the MPS section, the driver's own elsewhere.
	standInUID int
	pods       map[string]podSpec
	ctrs       map[string]*container
	order      []*container // every container created, refused ones too
	running    map[string]*workload
	manifest   string
}

// run is the whole benchmark: every section and phase of the plan, the table, the JSON.
// A failure stops the run; the phases measured before it are kept in the result.
func run(ctx context.Context, o *options) (res *result, err error) {
	start := time.Now()
	phases, err := selectSections(plan(o.Plan), o.Plan.Sections)
	if err != nil {
		return nil, err
	}
	res = &result{Schema: resultSchema, Started: start, Fake: o.Fake, Config: runConfig{
		PhaseS: o.Plan.Phase.Seconds(), ShortS: o.Plan.Short.Seconds(), LeadS: o.Plan.Lead.Seconds(),
		LSRate: o.LSRate, LSMatmuls: o.LSMatmuls, LSSize: o.LSSize, BatchSize: o.BatchSize,
		BatchEvery: o.BatchEvery, DeepEvery: o.DeepEvery, MPS: o.MPS, LSGPUMilli: o.LSGPUMilli,
		BatchGPUMilli: o.BatchGPUMilli, Agent: fmt.Sprint(o.AgentCmd), EstimateS: estimate(phases).Seconds()},
		Host: hostInfo{CgroupRoot: o.CgroupRoot, CPUs: runtime.NumCPU()}}
	b := &bench{o: o, res: res, printf: func(f string, a ...any) { fmt.Fprintf(o.Stdout, f, a...) }}
	if !o.Fake {
		res.Host.GPU, res.Host.NvidiaSMI = gpuInfo(ctx)
	}
	b.tmp, err = os.MkdirTemp("", "understory-gpureal-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(b.tmp)
	if o.LogDir == "" {
		o.LogDir = b.tmp
	}
	if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
		return res, err
	}
	wlog, err := os.Create(filepath.Join(o.LogDir, "gpureal-standins.log"))
	if err != nil {
		return res, err
	}
	defer wlog.Close()
	b.wlog = &lockedWriter{w: wlog}
	if b.node, err = newNode(o.CgroupRoot); err != nil {
		return res, err
	}
	defer func() {
		if cerr := b.node.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	res.Host.CgroupLayout = b.node.hier.Layout().String()
	res.Host.KubeletRoot = b.node.kubeletRoot()
	if b.rt, err = startRuntime(b.tmp); err != nil {
		return res, err
	}
	defer b.rt.stop()
	b.printf("gpu-real: %d phases, about %v; GPU %q; cgroups %s below %s\n", len(phases),
		estimate(phases).Round(time.Second), res.Host.GPU, res.Host.CgroupLayout, b.node.kubeletRoot())

	err = b.runPhases(ctx, phases)
	if err != nil {
		res.Error = err.Error()
	}
	res.DurationS = time.Since(start).Seconds()
	fillRatios(res.Phases)
	res.Targets = evaluateTargets(res.Phases)
	return res, err
}

// runPhases runs the plan section by section.
func (b *bench) runPhases(ctx context.Context, phases []phaseSpec) (err error) {
	defer func() {
		if b.section != nil {
			err = errors.Join(err, b.endSection(ctx))
		}
	}()
	for i, ph := range phases {
		if b.section == nil || b.section.info.Name != ph.Section {
			if b.section != nil {
				if err := b.endSection(ctx); err != nil {
					return err
				}
			}
			if err := b.startSection(ctx, ph.Section, phases[i:]); err != nil {
				return fmt.Errorf("section %s: %w", ph.Section, err)
			}
		}
		pr, err := b.runPhase(ctx, ph)
		if err != nil {
			return fmt.Errorf("phase %s: %w", ph.Name, err)
		}
		b.res.Phases = append(b.res.Phases, pr)
		b.printPhase(pr)
	}
	return nil
}

func (b *bench) printPhase(p phaseResult) {
	ls, batch := "", ""
	if p.LS != nil && p.LS.Requests > 0 {
		ls = fmt.Sprintf(" LS p50 %.2f p99 %.2f ms (first s %.2f)", p.LS.P50, p.LS.P99, p.LS.FirstSecondP99)
	}
	if p.Batch != nil {
		batch = fmt.Sprintf(" batch %.0f matmuls/s", p.Batch.PerSecond)
	}
	if p.Recovery != nil {
		batch += fmt.Sprintf(" (90 %% of alone %.2f s after LS idle)", p.Recovery.Seconds)
	}
	if p.MemCap != nil {
		batch += " memory cap " + p.MemCap.Verdict
	}
	b.printf("  %-18s%s%s %s\n", p.Name, ls, batch, decisionsSummary(p.Agent))
}

// sectionPods are the pods of a section: LS, and the batch kinds its phases use. UIDs
// are fresh per section (new pods, as a new deployment would make).
func (b *bench) sectionPods(section string, phases []phaseSpec) map[string]podSpec {
	pods := map[string]podSpec{}
	add := func(role string, class qos.Class, milli, cpu int) {
		pods[role] = podSpec{Name: "gpureal-" + role + "-" + section, UID: types.UID(newUUID()), Class: class,
			GPUMilli: milli, CPURequestMilli: cpu}
	}
	for _, ph := range phases {
		if ph.Section != section {
			break
		}
		if ph.LSMode != lsOff && ph.LSMode != lsArrive {
			// LS busy-waits a core in synchronize: it requests one (Burstable).
			add(roleLS, qos.ClassLS, b.o.LSGPUMilli, 1000)
		}
		if ph.BatchKind != batchNone {
			add(ph.BatchKind, qos.ClassBatch, b.o.BatchGPUMilli, 0)
		}
	}
	return pods
}

// startSection starts the section's agent (none for the nothing-done section) and its
// batch stand-ins; LS starts with them unless the section measures batch alone first.
func (b *bench) startSection(ctx context.Context, name string, rest []phaseSpec) error {
	s := &sectionRun{info: &sectionInfo{Name: name}, ctrs: map[string]*container{}, running: map[string]*workload{}}
	b.section = s
	s.pods = b.sectionPods(name, rest)
	s.manifest = filepath.Join(b.tmp, "manifests-"+name)
	if err := os.MkdirAll(s.manifest, 0o755); err != nil {
		return err
	}
	for _, p := range s.pods {
		m, err := renderManifest(p)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(s.manifest, p.Name+".yaml"), m, 0o644); err != nil {
			return err
		}
	}
	b.printf("section %s\n", name)
	if name != sectionNothing {
		if err := b.startAgent(ctx, s); err != nil {
			return err
		}
	}
	var roles []string
	for role := range s.pods {
		if role != roleLS || !hasAlonePhase(rest, name) {
			roles = append(roles, role)
		}
	}
	return b.ensure(ctx, roles...)
}

// hasAlonePhase says whether the section measures batch alone (LS must not exist yet).
func hasAlonePhase(phases []phaseSpec, section string) bool {
	for _, ph := range phases {
		if ph.Section == section && ph.LSMode == lsOff {
			return true
		}
	}
	return false
}

func (s *sectionRun) uids() []string {
	var out []string
	for _, p := range s.pods {
		out = append(out, string(p.UID))
	}
	return out
}

// profileAgent saves a CPU profile of the agent over ph's window (from t0, less a second
// at each end) as LogDir/agent-<phase>.pprof; a failure is printed, never fatal.
func (b *bench) profileAgent(ctx context.Context, a *agentProc, ph phaseSpec, t0 time.Time) {
	secs := int((ph.Lead + ph.Window).Seconds()) - 2
	if secs < 1 || sleepCtx(ctx, time.Until(t0.Add(time.Second))) != nil {
		return
	}
	path := filepath.Join(b.o.LogDir, "agent-"+ph.Name+".pprof")
	if err := a.profile(ctx, secs, path); err != nil {
		b.printf("  warning: agent CPU profile of %s: %v\n", ph.Name, err)
	}
}

// startAgent writes the section's config and starts the agent, then waits for its pods
// and its NRI plugin.
func (b *bench) startAgent(ctx context.Context, s *sectionRun) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	spec := agentConfigSpec{CgroupRoot: b.o.CgroupRoot, KubeletRoot: b.node.kubeletRoot(), Manifests: s.manifest,
		Listen: addr, NRISocket: b.rt.socket, Extra: b.o.AgentConfigExtra, MPSClientUID: mpsClientUID}
	s.standInUID = os.Getuid()
	switch {
	case b.o.MPS == mpsNone:
	case s.info.Name == sectionMPS:
		spec.MPSMode = "run"
		s.mpsPipe = b.o.MPSPipe
		if s.mpsPipe == "" {
			s.mpsPipe = filepath.Join(b.tmp, "mps-pipe")
		}
		// The daemon's logs go with the bench's (-log-dir): they say why a client waited.
		// The shm directory is the run's own too; the agent creates it (the client UID's,
		// 0700) and starts the daemon with it as /dev/shm, as the launcher gives it to
		// the clients.
		spec.MPSPipe, spec.MPSLog = s.mpsPipe, filepath.Join(b.o.LogDir, "mps")
		spec.MPSShm = filepath.Join(b.tmp, "mps-shm")
		for _, d := range []string{spec.MPSPipe, spec.MPSLog} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		// The stand-ins run as the client UID: root is no MPS client. They must reach
		// the pipe directory below the run's directory.
		s.standInUID = mpsClientUID
		if err := os.Chmod(b.tmp, 0o711); err != nil {
			return err
		}
	default:
		spec.MPSMode = "disabled"
	}
	cfg, err := renderAgentConfig(spec)
	if err != nil {
		return err
	}
	s.info.AgentConfig = string(cfg)
	cfgPath := filepath.Join(b.tmp, "agent-"+s.info.Name+".yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return err
	}
	argv := append(append([]string{}, b.o.AgentCmd...), "-config", cfgPath)
	s.agent, err = startAgent(argv, b.o.AgentEnv, addr, filepath.Join(b.o.LogDir, "gpureal-agent-"+s.info.Name+".log"))
	if err != nil {
		return err
	}
	if _, err := s.agent.waitPods(ctx, s.uids(), time.Minute); err != nil {
		return err
	}
	if err := b.rt.waitPlugin(ctx, b.node.kubeletRoot(), 30*time.Second); err != nil {
		return err
	}
	if s.mpsPipe != "" {
		// Containers created before the agent's MPS daemon answers run time-sliced.
		if err := waitMPSDaemon(ctx, s.mpsPipe, 30*time.Second); err != nil {
			s.info.Notes = append(s.info.Notes, err.Error())
			b.printf("  warning: %v\n", err)
		}
	}
	return nil
}

// waitMPSDaemon waits for the control daemon's socket in the pipe directory, then a
// second more for the agent to see it ready.
func waitMPSDaemon(ctx context.Context, pipe string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(filepath.Join(pipe, "control")); err == nil {
			return sleepCtx(ctx, time.Second)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no MPS control daemon in %s within %v (agent log: gpureal-agent-%s.log)", pipe, timeout,
				sectionMPS)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// ensure starts the roles' stand-ins that are not running, together, and waits until
// each is ready.
func (b *bench) ensure(ctx context.Context, roles ...string) error {
	s := b.section
	var started []string
	for _, role := range roles {
		if s.running[role] != nil {
			continue
		}
		if err := b.startWorkload(ctx, role, s.pods[role]); err != nil {
			return err
		}
		started = append(started, role)
	}
	var errs []error
	for _, role := range started {
		w := s.running[role]
		if err := w.waitReady(ctx, b.o.ReadyTimeout); err != nil {
			errs = append(errs, err)
			continue
		}
		c := s.ctrs[role]
		c.report.PID, c.report.Device, c.report.SawEnv, c.report.WarmMS = w.ready.PID, w.ready.Device, w.ready.Env,
			w.ready.WarmMS
		c.report.UID = procUID(w.ready.PID)
		if b.res.Host.Torch == "" {
			b.res.Host.Torch = w.ready.Torch
		}
		if err := b.rt.started(ctx, c); err != nil {
			errs = append(errs, fmt.Errorf("StartContainer %s: %w", role, err))
		}
		b.printf("  %s ready (pid %d, %s, warm-up %.2f ms)%s\n", role, w.ready.PID, w.ready.Device, w.ready.WarmMS,
			envNote(w.ready.Env))
		if s.mpsPipe != "" && w.ready.Env["CUDA_MPS_PIPE_DIRECTORY"] == "" {
			note := fmt.Sprintf("%s got no CUDA_MPS_* from the agent's NRI plugin: it runs time-sliced, not as an "+
				"MPS client", role)
			s.info.Notes = append(s.info.Notes, note)
			b.printf("  warning: %s\n", note)
		}
	}
	if len(started) > 0 && !b.o.Fake {
		s.info.GPUProcs = gpuProcesses(ctx)
	}
	return errors.Join(errs...)
}

func envNote(env map[string]string) string {
	if len(env) == 0 {
		return ""
	}
	return fmt.Sprintf(" env %v", env)
}

// startWorkload creates the container through NRI, its cgroup, and starts the stand-in
// in it with NRI's environment.
func (b *bench) startWorkload(ctx context.Context, role string, p podSpec) error {
	s := b.section
	parent, err := b.node.podParent(p)
	if err != nil {
		return err
	}
	c, err := b.rt.createContainer(ctx, p, parent, s.standInUID)
	if c != nil {
		s.order = append(s.order, c)
	}
	if err != nil {
		return err
	}
	s.ctrs[role] = c
	rel, err := b.node.createContainer(c.cgroup)
	if err != nil {
		return err
	}
	c.cgroup = rel
	w, err := startWorkload(launchSpec{Role: role, Self: b.o.Self, CgroupRoot: b.o.CgroupRoot, Cgroup: rel,
		UID: s.standInUID, Mounts: c.mounts,
		Argv: workloadArgv(b.o, role), Env: envWith(baseEnv(), c.setEnv, c.removeEnv),
		Log: prefixWriter(b.wlog, s.info.Name+"/"+role+": ")})
	if err != nil {
		return err
	}
	s.running[role] = w
	return nil
}

// stopWorkload ends a stand-in and removes its container through NRI.
func (b *bench) stopWorkload(ctx context.Context, role string) error {
	s := b.section
	w := s.running[role]
	if w == nil {
		return nil
	}
	delete(s.running, role)
	c := s.ctrs[role]
	// A frozen stand-in handles no input and, on v1, does not die: the fallback thaws the
	// whole tree (the agent may have frozen an ancestor, its tier).
	err := w.quit(20*time.Second, b.node.thawAll)
	// The pod is deleted: its manifest goes, as the API server's pod would.
	rmErr := os.Remove(filepath.Join(s.manifest, s.pods[role].Name+".yaml"))
	return errors.Join(err, b.rt.remove(ctx, c), rmErr)
}

// endSection stops the stand-ins and the agent (measuring its CPU over the section).
func (b *bench) endSection(ctx context.Context) error {
	s := b.section
	b.section = nil
	var errs []error
	for role := range s.running {
		b.section = s
		errs = append(errs, b.stopWorkload(ctx, role))
		b.section = nil
	}
	if s.agent != nil {
		if err := s.agent.stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping the agent: %w", err))
		}
	}
	if s.mpsPipe != "" {
		if note := quitMPS(ctx, s.mpsPipe); note != "" {
			s.info.Notes = append(s.info.Notes, note)
		}
	}
	for _, c := range s.order {
		s.info.Containers = append(s.info.Containers, c.report)
	}
	b.res.Sections = append(b.res.Sections, *s.info)
	return errors.Join(errs...)
}

// timing of a phase's start: commands reach the stand-ins well before.
const phaseStartDelay = 300 * time.Millisecond

// runPhase runs one phase: commands with absolute start and end times to the stand-ins,
// /status sampled, the agent's CPU read around it.
func (b *bench) runPhase(ctx context.Context, ph phaseSpec) (phaseResult, error) {
	s := b.section
	if ph.LSMode == lsMem {
		return b.runMemPhase(ctx, ph)
	}
	pr := phaseResult{phaseSpec: ph, LeadS: ph.Lead.Seconds(), WindowS: ph.Window.Seconds()}
	if ph.StopLSBefore {
		if err := b.stopWorkload(ctx, roleLS); err != nil {
			return pr, err
		}
	}
	var need []string
	if ph.BatchKind != batchNone {
		need = append(need, ph.BatchKind)
	}
	if ph.LSMode != lsOff && ph.LSMode != lsArrive {
		need = append(need, roleLS)
	}
	if err := b.ensure(ctx, need...); err != nil {
		return pr, err
	}
	t0 := time.Now().Add(phaseStartDelay)
	pr.Start = t0
	lead, win := ph.Lead.Seconds(), ph.Window.Seconds()

	var cpu0 float64
	var stopSampler func() []statusSample
	if s.agent != nil {
		c, err := cpuSeconds("/proc", s.agent.cmd.Process.Pid)
		if err != nil {
			return pr, fmt.Errorf("the agent's CPU: %w", err)
		}
		cpu0 = c
		// /status costs the agent CPU: the phases that time a reaction read it every
		// 100 ms, the steady ones (whose CPU the target judges) every second.
		period := time.Second
		if ph.LSMode != lsRun {
			period = 100 * time.Millisecond
		}
		stopSampler = startSampler(ctx, s.agent, t0, period)
		if b.o.ProfileAgent && (ph.Name == phAgent || ph.Name == phMPS) {
			go b.profileAgent(ctx, s.agent, ph, t0)
		}
	}

	var batch *workload
	if ph.BatchKind != batchNone {
		batch = s.running[ph.BatchKind]
		end := unix(t0) + lead + win
		if ph.LSMode == lsArrive {
			end = 0 // until the arriving LS is done
		}
		if err := batch.send(command{Cmd: "run", Phase: ph.Name, Start: unix(t0), End: end}); err != nil {
			return pr, err
		}
	}
	// The LS window, seconds after t0, for the batch's measurement.
	lsFrom, lsTo := lead, lead+win
	var lsEv event
	var lsErr error
	timeout := ph.Lead + ph.Window + 60*time.Second
	switch ph.LSMode {
	case lsRun, lsGoIdle, lsWake:
		ls := s.running[roleLS]
		start, end := unix(t0), unix(t0)+lead+win
		switch ph.LSMode {
		case lsRun:
			lsFrom, lsTo = 0, win
		case lsGoIdle:
			end = unix(t0) + lead
		case lsWake:
			start = unix(t0) + lead
		}
		if err := ls.send(command{Cmd: "run", Phase: ph.Name, Start: start, End: end, Mode: "run"}); err != nil {
			return pr, err
		}
		lsEv, lsErr = ls.next(ctx, "result", timeout)
	case lsArrive:
		lsEv, lsFrom, lsTo, lsErr = b.arrive(ctx, ph, t0)
	}
	var batchEv event
	var batchErr error
	if batch != nil {
		if ph.LSMode == lsArrive {
			_ = batch.send(command{Cmd: "stop"})
		}
		batchEv, batchErr = batch.next(ctx, "result", timeout)
	}
	if stopSampler != nil {
		pr.Agent = stopSampler()
		for _, d := range pr.Agent {
			if strings.Contains(d.Key, "cpuFreeze=true") {
				pr.Notes = append(pr.Notes, "the agent's CPU escalation froze the batch tier during this phase: "+
					"batch's figures are not only the GPU levers'")
				b.printf("  warning: %s: the agent froze batch for CPU reasons too\n", ph.Name)
				break
			}
		}
		if c, err := cpuSeconds("/proc", s.agent.cmd.Process.Pid); err == nil {
			v := 100 * (c - cpu0) / time.Since(t0).Seconds()
			pr.AgentCPUPct = &v
		}
	}
	if err := errors.Join(lsErr, batchErr); err != nil {
		return pr, err
	}

	switch ph.LSMode {
	case lsRun, lsWake, lsArrive:
		st := summariseLS(lsEv.lsRunResult, 0, win)
		pr.LS = &st
	case lsGoIdle:
		// LS is idle in the window: its lead-in is kept apart, so that the phase is judged
		// on batch alone (an idle LS has no latency to protect).
		st := summariseLS(lsEv.lsRunResult, 0, lead)
		pr.LeadLS = &st
	}
	if batch != nil {
		from, to := lsFrom, lsTo
		if ph.LSMode == lsOff || ph.LSMode == lsRun {
			from, to = 0, win
		}
		st := summariseBatch(batchEv.batchRunResult, from, to)
		pr.Batch = &st
		if ph.LSMode == lsGoIdle {
			alone := 0.0
			if a := byName(b.res.Phases)[phBatchAlone]; a != nil && a.Batch != nil {
				alone = a.Batch.PerSecond
			}
			rec := timeToRate(batchEv.batchRunResult, lead, lead+win, alone, targetIdleFrac)
			pr.Recovery = &rec
		}
	}
	// Let the GPU's queue drain before the next phase.
	time.Sleep(500 * time.Millisecond)
	return pr, nil
}

// arrive starts a new LS pod where batch runs, after the lead-in, and runs its open loop
// for the window from when it is ready. It returns the LS result and its window in
// seconds after t0.
func (b *bench) arrive(ctx context.Context, ph phaseSpec, t0 time.Time) (event, float64, float64, error) {
	s := b.section
	if err := sleepCtx(ctx, time.Until(t0.Add(ph.Lead))); err != nil {
		return event{}, 0, 0, err
	}
	p := podSpec{Name: "gpureal-ls-arrives-" + s.info.Name, UID: types.UID(newUUID()), Class: qos.ClassLS,
		GPUMilli: b.o.LSGPUMilli, CPURequestMilli: 1000}
	m, err := renderManifest(p)
	if err != nil {
		return event{}, 0, 0, err
	}
	// The pod is bound (its manifest seen by the agent) before its container is created.
	if err := os.WriteFile(filepath.Join(s.manifest, p.Name+".yaml"), m, 0o644); err != nil {
		return event{}, 0, 0, err
	}
	s.pods[roleLS] = p
	if s.agent != nil {
		if _, err := s.agent.waitPods(ctx, []string{string(p.UID)}, 30*time.Second); err != nil {
			return event{}, 0, 0, err
		}
	}
	if err := b.ensure(ctx, roleLS); err != nil {
		return event{}, 0, 0, err
	}
	start := time.Now().Add(100 * time.Millisecond)
	ls := s.running[roleLS]
	if err := ls.send(command{Cmd: "run", Phase: ph.Name, Start: unix(start), End: unix(start) + ph.Window.Seconds(),
		Mode: "run"}); err != nil {
		return event{}, 0, 0, err
	}
	ev, err := ls.next(ctx, "result", ph.Window+60*time.Second)
	from := start.Sub(t0).Seconds()
	return ev, from, from + ph.Window.Seconds(), err
}

// startSampler samples /status every period from now; the returned func stops it and
// returns the decisions.
func startSampler(ctx context.Context, a *agentProc, t0 time.Time, period time.Duration) func() []statusSample {
	ctx, cancel := context.WithCancel(ctx)
	s := &sampler{start: t0}
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx, a, period) }()
	return func() []statusSample {
		cancel()
		<-done
		return s.result()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// newUUID is a random RFC 4122 version-4 UUID (a pod UID).
func newUUID() string {
	b := []byte(randomID()[:32])
	b[12] = '4'
	b[16] = "89ab"[b[16]%4]
	return fmt.Sprintf("%s-%s-%s-%s-%s", b[0:8], b[8:12], b[12:16], b[16:20], b[20:32])
}

// lockedWriter serialises writes of several stand-ins' logs.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// prefixWriter prefixes each write (a stand-in writes its log a line at a time).
func prefixWriter(w io.Writer, prefix string) io.Writer { return &prefixed{w: w, p: []byte(prefix)} }

type prefixed struct {
	w io.Writer
	p []byte
}

func (p *prefixed) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append(append([]byte{}, p.p...), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}
