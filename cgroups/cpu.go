package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
)

// Kernel bounds for cpu.shares (v1). cpu.weight (v2) is [1, 10000].
const (
	MinShares uint64 = 2
	MaxShares uint64 = 262144
)

// Kernel bounds for CFS bandwidth control (kernel/sched/core.c).
const (
	MinCFSPeriod = time.Millisecond
	MaxCFSPeriod = time.Second
	MinCFSQuota  = time.Millisecond
	// MaxCFSQuota is the kernel's max_cfs_runtime: (2^44-1) µs.
	MaxCFSQuota = time.Duration(1<<44-1) * time.Microsecond
)

// Unlimited is the quota CPULimit reports (and SetCPULimit accepts, as any
// negative value) for "no CFS quota" (v1 -1, v2 "max").
const Unlimited time.Duration = -1

// SharesToWeight converts v1 cpu.shares to v2 cpu.weight with kubelet's
// linear formula 1 + ((shares-2)*9999)/262142 (2 -> 1, 1024 -> 39,
// 262144 -> 10000). Out-of-range shares are clamped first. This is not
// containerd/cgroups' ConvertCPUSharesToCgroupV2Value (1024 -> 100): our
// groups sit next to kubelet-written siblings and must use kubelet's scale.
func SharesToWeight(shares uint64) uint64 {
	shares = min(max(shares, MinShares), MaxShares)
	return 1 + ((shares-MinShares)*9999)/(MaxShares-MinShares)
}

// CPUStats is the group's cumulative CPU accounting.
type CPUStats struct {
	Usage       time.Duration // total CPU time consumed by the group
	NrPeriods   uint64        // enforcement periods with runnable tasks
	NrThrottled uint64        // periods in which the group was throttled
	Throttled   time.Duration // total time throttled
}

const (
	fileShares  = "cpu.shares"
	fileWeight  = "cpu.weight"
	fileIdle    = "cpu.idle"
	filePeriod  = "cpu.cfs_period_us"
	fileQuota   = "cpu.cfs_quota_us"
	fileCPUMax  = "cpu.max"
	fileCPUStat = "cpu.stat"
	fileUsage   = "cpuacct.usage"
)

// SetCPUShares sets the group's CPU weight: v1 cpu.shares, v2 cpu.weight
// converted with SharesToWeight. shares must be in [MinShares, MaxShares].
// While the group is idle (cpu.idle=1) the kernel rejects weight writes;
// that case returns an error wrapping ErrIdle.
func (g *Group) SetCPUShares(shares uint64) error {
	if shares < MinShares || shares > MaxShares {
		return fmt.Errorf("setting cpu shares %d on %s (want [%d,%d]): %w", shares, g.rel, MinShares, MaxShares, ErrInvalidValue)
	}
	dir := g.cpuDir()
	var err error
	if g.h.layout == LayoutV2 {
		w := SharesToWeight(shares)
		if err = requireFile(dir, fileWeight); err == nil {
			if uerr := g.v2.Update(&cgroup2.Resources{CPU: &cgroup2.CPU{Weight: &w}}); uerr != nil {
				err = classify("writing "+strconv.FormatUint(w, 10)+" to", dir, fileWeight, uerr)
			}
		}
	} else {
		err = writeFile(dir, fileShares, strconv.FormatUint(shares, 10))
	}
	if errors.Is(err, ErrInvalidValue) {
		if idle, ierr := g.idle(); ierr == nil && idle {
			return fmt.Errorf("setting cpu shares on %s: %w: %w", g.rel, ErrIdle, err)
		}
	}
	return err
}

// SetIdle sets cpu.idle (SCHED_IDLE for the whole group: it only runs when
// nothing else wants the CPU). v1 cpu hierarchy on kernels >= 5.15, v2
// cpu.idle; ErrUnsupported when the file is absent.
//
// Kernel quirks: while idle=1, cpu.shares reads 3 and writes to it fail
// (see ErrIdle); switching idle back to 0 resets cpu.shares to 1024, not to
// the value set before - set the weight again afterwards.
func (g *Group) SetIdle(idle bool) error {
	v := "0"
	if idle {
		v = "1"
	}
	return writeFile(g.cpuDir(), fileIdle, v)
}

func (g *Group) idle() (bool, error) {
	v, err := readInt(g.cpuDir(), fileIdle)
	return v == 1, err
}

// SetCPULimit sets the CFS bandwidth limit: at most quota of CPU time per
// period (quota/period CPUs). quota < 0 removes the limit. period must be
// in [MinCFSPeriod, MaxCFSPeriod], quota (unless negative) in
// [MinCFSQuota, MaxCFSQuota]; durations are truncated to microseconds.
//
// v2 writes cpu.max atomically. v1 needs two writes, and the kernel rejects
// a write whose intermediate quota/period ratio exceeds the parent's limit
// or falls below a child's; SetCPULimit orders the writes to stay in range
// and, if the kernel still refuses, passes through "unlimited" (always
// valid) before applying the final value. Unchanged values are not written.
func (g *Group) SetCPULimit(quota, period time.Duration) error {
	if period < MinCFSPeriod || period > MaxCFSPeriod {
		return fmt.Errorf("setting cpu limit on %s: period %v outside [%v,%v]: %w", g.rel, period, MinCFSPeriod, MaxCFSPeriod, ErrInvalidValue)
	}
	if quota >= 0 && (quota < MinCFSQuota || quota > MaxCFSQuota) {
		return fmt.Errorf("setting cpu limit on %s: quota %v outside [%v,%v] (negative = unlimited): %w", g.rel, quota, MinCFSQuota, MaxCFSQuota, ErrInvalidValue)
	}
	q := int64(-1)
	if quota >= 0 {
		q = quota.Microseconds()
	}
	p := period.Microseconds()
	dir := g.cpuDir()
	if g.h.layout == LayoutV2 {
		if err := requireFile(dir, fileCPUMax); err != nil {
			return err
		}
		up := uint64(p)
		var qp *int64
		if q >= 0 {
			qp = &q
		}
		if err := g.v2.Update(&cgroup2.Resources{CPU: &cgroup2.CPU{Max: cgroup2.NewCPUMax(qp, &up)}}); err != nil {
			return classify("writing cpu limit to", dir, fileCPUMax, err)
		}
		return nil
	}
	return applyCFS(dirCFS(dir), q, p)
}

// CPULimit returns the CFS quota and period; quota is Unlimited (negative)
// when there is no limit.
func (g *Group) CPULimit() (quota, period time.Duration, err error) {
	dir := g.cpuDir()
	var q, p int64
	if g.h.layout == LayoutV2 {
		b, err := readFile(dir, fileCPUMax)
		if err != nil {
			return 0, 0, err
		}
		q, p, err = parseCPUMax(b)
		if err != nil {
			return 0, 0, classifyMalformed(dir, fileCPUMax, err)
		}
	} else {
		q, p, err = dirCFS(dir).readCFS()
		if err != nil {
			return 0, 0, err
		}
	}
	period = time.Duration(p) * time.Microsecond
	if q < 0 {
		return Unlimited, period, nil
	}
	return time.Duration(q) * time.Microsecond, period, nil
}

// parseCPUMax parses v2 cpu.max: "max 100000" or "20000 100000".
func parseCPUMax(b []byte) (quota, period int64, err error) {
	f := bytes.Fields(b)
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("want \"<quota|max> <period>\", got %q", b)
	}
	p, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil || p <= 0 {
		return 0, 0, fmt.Errorf("period %q: bad value", f[1])
	}
	if string(f[0]) == "max" {
		return -1, p, nil
	}
	q, err := strconv.ParseInt(string(f[0]), 10, 64)
	if err != nil || q < 0 {
		return 0, 0, fmt.Errorf("quota %q: bad value", f[0])
	}
	return q, p, nil
}

func classifyMalformed(dir, name string, err error) error {
	return fmt.Errorf("parsing %s/%s: %w: %w", dir, name, ErrMalformed, err)
}

// Stats returns the group's CPU accounting: v1 cpuacct.usage (ns) and
// cpu.stat nr_periods, nr_throttled, throttled_time (ns); v2 cpu.stat
// usage_usec, nr_periods, nr_throttled, throttled_usec. Throttling fields
// are zero when the kernel does not report them (v2 without the cpu
// controller enabled).
func (g *Group) Stats() (CPUStats, error) {
	dir := g.cpuDir()
	b, err := readFile(dir, fileCPUStat)
	if err != nil {
		return CPUStats{}, err
	}
	st, err := parseCPUStat(b, g.h.layout == LayoutV2)
	if err != nil {
		return CPUStats{}, classifyMalformed(dir, fileCPUStat, err)
	}
	if g.h.layout != LayoutV2 {
		adir := g.cpuacctDir()
		u, err := readFile(adir, fileUsage)
		if err != nil {
			return CPUStats{}, err
		}
		ns, err := parseUsageNS(u)
		if err != nil {
			return CPUStats{}, classifyMalformed(adir, fileUsage, err)
		}
		st.Usage = ns
	}
	return st, nil
}

// parseCPUStat parses cpu.stat ("key value" lines). v2 values are in µs
// (usage_usec, throttled_usec) and usage_usec is required; v1 throttled_time
// is in ns and usage comes from cpuacct.usage instead. Unknown keys are
// ignored; a key seen twice, a malformed line or an overflowing value is an
// error.
func parseCPUStat(b []byte, v2 bool) (CPUStats, error) {
	var (
		st       CPUStats
		seen     = map[string]bool{}
		hasUsage bool
	)
	for line := range bytes.Lines(b) {
		line = bytes.TrimRight(line, "\n")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		f := bytes.Fields(line)
		if len(f) != 2 {
			return CPUStats{}, fmt.Errorf("line %q: want \"key value\"", line)
		}
		key := string(f[0])
		v, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return CPUStats{}, fmt.Errorf("line %q: %w", line, err)
		}
		if seen[key] {
			return CPUStats{}, fmt.Errorf("key %q repeated", key)
		}
		seen[key] = true
		switch {
		case key == "nr_periods":
			st.NrPeriods = v
		case key == "nr_throttled":
			st.NrThrottled = v
		case key == "throttled_time" && !v2:
			if st.Throttled, err = nsDuration(v); err != nil {
				return CPUStats{}, err
			}
		case key == "throttled_usec" && v2:
			if st.Throttled, err = usDuration(v); err != nil {
				return CPUStats{}, err
			}
		case key == "usage_usec" && v2:
			if st.Usage, err = usDuration(v); err != nil {
				return CPUStats{}, err
			}
			hasUsage = true
		}
	}
	if v2 && !hasUsage {
		return CPUStats{}, errors.New("no usage_usec")
	}
	return st, nil
}

// parseUsageNS parses v1 cpuacct.usage (one decimal number of ns) without
// allocating.
func parseUsageNS(b []byte) (time.Duration, error) {
	v, ok := parseDecimal(bytes.TrimSpace(b))
	if !ok {
		return 0, fmt.Errorf("cpuacct.usage %q: not a decimal number", b)
	}
	return nsDuration(v)
}

// parseDecimal parses a non-empty unsigned decimal without allocating.
func parseDecimal(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

var errOverflow = errors.New("value overflows time.Duration")

func nsDuration(v uint64) (time.Duration, error) {
	if v > math.MaxInt64 {
		return 0, errOverflow
	}
	return time.Duration(v), nil
}

func usDuration(v uint64) (time.Duration, error) {
	if v > math.MaxInt64/uint64(time.Microsecond) {
		return 0, errOverflow
	}
	return time.Duration(v) * time.Microsecond, nil
}

// --- v1 CFS write ordering ---

type cfsFile int

const (
	cfsQuota cfsFile = iota
	cfsPeriod
)

func (f cfsFile) String() string {
	if f == cfsQuota {
		return fileQuota
	}
	return filePeriod
}

type cfsWrite struct {
	file cfsFile
	val  int64 // µs; quota -1 = unlimited
}

// cfsIO is the v1 cpu.cfs_* pair; a seam so the ordering logic can be tested
// against a simulated kernel that enforces the hierarchical ratio rule.
type cfsIO interface {
	readCFS() (quotaUS, periodUS int64, err error)
	writeCFS(f cfsFile, v int64) error
}

type dirCFS string

var _ cfsIO = dirCFS("")

func (d dirCFS) readCFS() (int64, int64, error) {
	q, err := readInt(string(d), fileQuota)
	if err != nil {
		return 0, 0, err
	}
	p, err := readInt(string(d), filePeriod)
	if err != nil {
		return 0, 0, err
	}
	return q, p, nil
}

func (d dirCFS) writeCFS(f cfsFile, v int64) error {
	return writeFile(string(d), f.String(), strconv.FormatInt(v, 10))
}

// planCFS orders the v1 writes from (oq, op) to (nq, np) so that the
// intermediate state is, when possible, a ratio between the old and new
// ones (valid if both ends are); otherwise the lower intermediate ratio
// (the parent limit is the common constraint; a child's is rarer and
// handled by applyCFS's fallback). Quotas < 0 mean unlimited.
func planCFS(oq, op, nq, np int64) []cfsWrite {
	switch {
	case op == np:
		return []cfsWrite{{cfsQuota, nq}}
	case nq < 0:
		return []cfsWrite{{cfsQuota, -1}, {cfsPeriod, np}}
	case oq < 0:
		return []cfsWrite{{cfsPeriod, np}, {cfsQuota, nq}}
	}
	ro, rn := float64(oq)/float64(op), float64(nq)/float64(np)
	lo, hi := min(ro, rn), max(ro, rn)
	periodFirst := float64(oq) / float64(np) // state after writing the period
	quotaFirst := float64(nq) / float64(op)  // state after writing the quota
	in := func(r float64) bool { return r >= lo && r <= hi }
	pf := []cfsWrite{{cfsPeriod, np}, {cfsQuota, nq}}
	qf := []cfsWrite{{cfsQuota, nq}, {cfsPeriod, np}}
	switch {
	case in(periodFirst):
		return pf
	case in(quotaFirst):
		return qf
	case periodFirst <= quotaFirst:
		return pf
	default:
		return qf
	}
}

func runCFS(io cfsIO, plan []cfsWrite) error {
	for _, w := range plan {
		if err := io.writeCFS(w.file, w.val); err != nil {
			return err
		}
	}
	return nil
}

// applyCFS moves the v1 bandwidth settings to (nq, np) without a transient
// kernel rejection: the planned order first, then, on EINVAL, via quota -1
// ("unlimited" inherits the parent's limit, so it is always accepted), then
// the new period, then the new quota. If the final value itself is
// rejected the old setting is restored and the error returned.
func applyCFS(io cfsIO, nq, np int64) error {
	oq, op, err := io.readCFS()
	if err != nil {
		return err
	}
	if oq < 0 && nq < 0 {
		oq = nq
	}
	if oq == nq && op == np {
		return nil
	}
	err = runCFS(io, planCFS(oq, op, nq, np))
	if err == nil || !errors.Is(err, syscall.EINVAL) {
		return err
	}
	fallback := []cfsWrite{{cfsQuota, -1}, {cfsPeriod, np}}
	if nq >= 0 {
		fallback = append(fallback, cfsWrite{cfsQuota, nq})
	}
	if err := runCFS(io, fallback); err != nil {
		restore := []cfsWrite{{cfsQuota, -1}, {cfsPeriod, op}}
		if oq >= 0 {
			restore = append(restore, cfsWrite{cfsQuota, oq})
		}
		if rerr := runCFS(io, restore); rerr != nil {
			return fmt.Errorf("cfs quota %dus period %dus rejected, and restoring %dus/%dus failed (%v): %w", nq, np, oq, op, rerr, err)
		}
		return fmt.Errorf("cfs quota %dus period %dus rejected (outside the parent's limit or below a child's): %w", nq, np, err)
	}
	return nil
}
