package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/bits"
	"path/filepath"
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
		if idle, ierr := g.Idle(); ierr == nil && idle {
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

// Idle reports cpu.idle: true for a SCHED_IDLE group. kubelet never sets it
// on pod cgroups, so an idle pod cgroup with a CFS quota is one an agent
// run made in-place batch. ErrUnsupported when the kernel has no cpu.idle.
func (g *Group) Idle() (bool, error) {
	v, err := readInt(g.cpuDir(), fileIdle)
	if err != nil {
		return false, err
	}
	return v == 1, nil
}

// SetCPULimit sets the CFS bandwidth limit: at most quota of CPU time per
// period (quota/period CPUs). quota < 0 removes the limit. period must be
// in [MinCFSPeriod, MaxCFSPeriod], quota (unless negative) in
// [MinCFSQuota, MaxCFSQuota]; durations are truncated to microseconds.
//
// v2 writes cpu.max atomically and never refuses a ratio. v1 needs two
// writes, and the kernel rejects a write whose quota/period ratio exceeds
// the parent's limit or falls below a descendant's; SetCPULimit orders the
// writes to stay in range and never passes through "unlimited" (quota -1)
// on its way between two limits. When the target is below a descendant's
// ratio (a cut of a pod below its container's own quota), or is a period
// change no write order can make, the nearest setting the kernel accepts
// is applied (the descendant's ratio; the current period) and the error is
// a *ClampError wrapping ErrClamped, whose Applied field is what is now
// set. A target above the parent's limit is refused (ErrInvalidValue) and
// the old setting kept. Unchanged values are not written.
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
	if err := applyCFS(dirCFS(dir), q, p); err != nil {
		var ce *ClampError
		if errors.As(err, &ce) {
			ce.Group = g.rel
		}
		return err
	}
	return nil
}

// CFSLimit is a CFS bandwidth setting: Quota of CPU time per Period; Quota
// Unlimited (negative) for none.
type CFSLimit struct {
	Quota, Period time.Duration
}

// CPUs returns Quota/Period, or -1 when unlimited.
func (l CFSLimit) CPUs() float64 {
	if l.Quota < 0 || l.Period <= 0 {
		return -1
	}
	return float64(l.Quota) / float64(l.Period)
}

// ClampError reports a v1 SetCPULimit that applied a different limit than
// asked, because the kernel refuses the wanted one (see SetCPULimit).
// errors.Is(err, ErrClamped) holds; use errors.As to read Applied.
type ClampError struct {
	Group   string   // the group's relative path
	Wanted  CFSLimit // what the caller asked for
	Applied CFSLimit // what is set now (never unlimited unless it was before)
}

func (e *ClampError) Error() string {
	return fmt.Sprintf("setting cpu limit on %s: wanted %v per %v, applied %v per %v, the nearest the kernel "+
		"accepts under a child group's quota: %v", e.Group, e.Wanted.Quota, e.Wanted.Period, e.Applied.Quota, e.Applied.Period, ErrClamped)
}

// Unwrap returns ErrClamped.
func (e *ClampError) Unwrap() error { return ErrClamped }

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
	// floor returns the setting of the limited descendant with the highest
	// quota/period ratio, the lowest ratio the kernel accepts for the group;
	// quota -1 when no descendant has a quota.
	floor() (quotaUS, periodUS int64, err error)
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

// floor walks every descendant (an unlimited child inherits the group's
// limit, so its limited children count too). Descendants that vanish during
// the walk are skipped; the group itself vanishing wraps ErrNotExist.
func (d dirCFS) floor() (int64, int64, error) {
	fq, fp := int64(-1), int64(1)
	err := filepath.WalkDir(string(d), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p != string(d) && isGone(err) {
				return nil
			}
			return err
		}
		if !e.IsDir() || p == string(d) {
			return nil
		}
		q, per, err := dirCFS(p).readCFS()
		if err != nil {
			if errors.Is(err, ErrNotExist) || errors.Is(err, ErrUnsupported) {
				return fs.SkipDir // vanished, or not a group
			}
			return err
		}
		if q >= 0 && per > 0 && (fq < 0 || ratioLess(fq, fp, q, per)) {
			fq, fp = q, per
		}
		return nil
	})
	if err != nil {
		return 0, 0, classify("reading cfs limits below", string(d), "", err)
	}
	return fq, fp, nil
}

// planCFS orders the v1 writes from (oq, op) to (nq, np) so that the
// intermediate state is, when possible, a ratio between the old and new
// ones (valid if both ends are); otherwise the lower intermediate ratio
// (the parent limit is the common constraint; a child's is rarer and
// handled by applyCFS's clamp). Quotas < 0 mean unlimited: -1 is written
// only when it is the target.
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
// kernel rejection where it can, and never through "unlimited" (quota -1)
// unless -1 is the old or the new setting: a cut of a batch group that
// passes through -1 leaves it unthrottled, and a caller retrying every
// period keeps it there.
//
// The planned order comes first, then the other one. If the kernel rejects
// both (EINVAL), the
// limited descendant with the highest quota/period ratio sets a floor
// (tg_cfs_schedulable_down: no descendant may have a higher ratio than its
// nearest limited ancestor), and applyCFS tries, in turn, the target with
// its quota raised to that floor, then the same ratio at the current period
// (a period change that no two-write order can make). The first accepted
// one is applied; if it is not (nq, np) the result is a *ClampError
// (ErrClamped). If nothing is accepted (e.g. the target exceeds the
// parent's limit) the old setting is restored and the kernel's error
// returned.
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
	rejected := moveCFS(io, oq, op, nq, np)
	if rejected == nil || !errors.Is(rejected, syscall.EINVAL) {
		return rejected
	}
	// A two-write plan may have made its first write: start from what is set.
	cq, cp, err := io.readCFS()
	if err != nil {
		return err
	}
	var cands [][2]int64
	if nq >= 0 {
		fq, fp, err := io.floor()
		if err != nil {
			return err
		}
		tq := nq
		if fq >= 0 && ratioLess(nq, np, fq, fp) {
			tq = max(scaleCeil(fq, np, fp), MinCFSQuota.Microseconds())
		}
		if tq != nq {
			cands = append(cands, [2]int64{tq, np})
		}
		if np != cp {
			kq := max(scaleCeil(tq, cp, np), MinCFSQuota.Microseconds())
			if fq >= 0 {
				kq = max(kq, scaleCeil(fq, cp, fp))
			}
			cands = append(cands, [2]int64{kq, cp})
		}
	}
	for _, c := range cands {
		if c[0] > MaxCFSQuota.Microseconds() {
			continue
		}
		if c[0] != cq || c[1] != cp {
			err := moveCFS(io, cq, cp, c[0], c[1])
			if err != nil && !errors.Is(err, syscall.EINVAL) {
				return err
			}
			if cq, cp, err = io.readCFS(); err != nil {
				return err
			}
			if c[0] != cq || c[1] != cp {
				continue
			}
		}
		return &ClampError{
			Wanted:  CFSLimit{Quota: cfsDuration(nq), Period: cfsDuration(np)},
			Applied: CFSLimit{Quota: cfsDuration(cq), Period: cfsDuration(cp)},
		}
	}
	if cq != oq || cp != op {
		if err := moveCFS(io, cq, cp, oq, op); err != nil {
			return fmt.Errorf("cfs quota %dus period %dus rejected, and restoring %dus/%dus failed (%v): %w", nq, np, oq, op, err, rejected)
		}
	}
	return fmt.Errorf("cfs quota %dus period %dus rejected (outside the parent's limit or below a child's): %w", nq, np, rejected)
}

// moveCFS moves from the current (cq, cp) to (q, p): the planned order,
// then, if the kernel rejected it and two writes are needed, the other
// order (after undoing the plan's first write if that one went through).
// -1 is written only when q is -1 (planCFS never writes it otherwise).
func moveCFS(io cfsIO, cq, cp, q, p int64) error {
	plan := planCFS(cq, cp, q, p)
	err := runCFS(io, plan)
	if err == nil || !errors.Is(err, syscall.EINVAL) || len(plan) < 2 {
		return err
	}
	nowQ, nowP, rerr := io.readCFS()
	if rerr != nil {
		return rerr
	}
	if nowQ == q && nowP == p {
		return nil
	}
	if nowQ != cq || nowP != cp {
		undo := cfsWrite{cfsQuota, cq}
		if plan[0].file == cfsPeriod {
			undo = cfsWrite{cfsPeriod, cp}
		}
		if uerr := io.writeCFS(undo.file, undo.val); uerr != nil {
			return err
		}
	}
	if plan[0].file == cfsPeriod {
		return runCFS(io, []cfsWrite{{cfsQuota, q}, {cfsPeriod, p}})
	}
	return runCFS(io, []cfsWrite{{cfsPeriod, p}, {cfsQuota, q}})
}

func cfsDuration(us int64) time.Duration {
	if us < 0 {
		return Unlimited
	}
	return time.Duration(us) * time.Microsecond
}

// ratioLess reports whether q1/p1 < q2/p2 exactly (all arguments >= 0,
// periods > 0): q1*p2 < q2*p1 in 128 bits.
func ratioLess(q1, p1, q2, p2 int64) bool {
	h1, l1 := bits.Mul64(uint64(q1), uint64(p2))
	h2, l2 := bits.Mul64(uint64(q2), uint64(p1))
	return h1 < h2 || (h1 == h2 && l1 < l2)
}

// scaleCeil returns ceil(q*np/p): the smallest quota over period np whose
// ratio is not below q/p (so the kernel's truncated fixed-point ratio is not
// below it either). It saturates at math.MaxInt64.
func scaleCeil(q, np, p int64) int64 {
	hi, lo := bits.Mul64(uint64(q), uint64(np))
	if hi >= uint64(p) {
		return math.MaxInt64
	}
	quo, rem := bits.Div64(hi, lo, uint64(p))
	if rem != 0 {
		quo++
	}
	if quo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(quo)
}
