package cgroups

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSharesToWeight(t *testing.T) {
	t.Parallel()
	// Values computed by hand from kubelet's 1 + ((shares-2)*9999)/262142.
	for _, tc := range []struct{ shares, weight uint64 }{
		{0, 1}, {1, 1}, {2, 1}, {3, 1}, {28, 1}, {29, 2}, {102, 4}, {512, 20}, {1024, 39},
		{2048, 79}, {10000, 382}, {262143, 9999}, {262144, 10000}, {1 << 30, 10000},
	} {
		if got := SharesToWeight(tc.shares); got != tc.weight {
			t.Errorf("SharesToWeight(%d) = %d, want %d", tc.shares, got, tc.weight)
		}
	}
}

func TestSetCPUShares(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			for _, tc := range []struct {
				shares uint64
				v1, v2 string
				err    error
			}{
				{2, "2", "1", nil},
				{1024, "1024", "39", nil},
				{262144, "262144", "10000", nil},
				{1, "", "", ErrInvalidValue},
				{0, "", "", ErrInvalidValue},
				{262145, "", "", ErrInvalidValue},
			} {
				err := g.SetCPUShares(tc.shares)
				if !errors.Is(err, tc.err) {
					t.Fatalf("SetCPUShares(%d) = %v, want %v", tc.shares, err, tc.err)
				}
				if tc.err != nil {
					continue
				}
				file, want := "cpu.shares", tc.v1
				if k.layout() == LayoutV2 {
					file, want = "cpu.weight", tc.v2
				}
				if got := strings.TrimSpace(mustRead(t, filepath.Join(g.cpuDir(), file))); got != want {
					t.Errorf("SetCPUShares(%d): %s = %q, want %q", tc.shares, file, got, want)
				}
			}
		})
	}
}

func TestSetCPULimit(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			for _, tc := range []struct {
				quota, period time.Duration
				v1q, v1p, v2  string
				wantQ         time.Duration
				err           error
			}{
				{200 * time.Millisecond, time.Second, "200000", "1000000", "200000 1000000", 200 * time.Millisecond, nil},
				{20 * time.Millisecond, 100 * time.Millisecond, "20000", "100000", "20000 100000", 20 * time.Millisecond, nil},
				{1500 * time.Microsecond, 10 * time.Millisecond, "1500", "10000", "1500 10000", 1500 * time.Microsecond, nil},
				{time.Millisecond, time.Millisecond, "1000", "1000", "1000 1000", time.Millisecond, nil},
				{4 * time.Second, 100 * time.Millisecond, "4000000", "100000", "4000000 100000", 4 * time.Second, nil},
				{-1, 100 * time.Millisecond, "-1", "100000", "max 100000", Unlimited, nil},
				{-time.Hour, 50 * time.Millisecond, "-1", "50000", "max 50000", Unlimited, nil},
				{20*time.Millisecond + 999, 100*time.Millisecond + 999, "20000", "100000", "20000 100000", 20 * time.Millisecond, nil},
				{0, 100 * time.Millisecond, "", "", "", 0, ErrInvalidValue},
				{999 * time.Microsecond, 100 * time.Millisecond, "", "", "", 0, ErrInvalidValue},
				{20 * time.Millisecond, 999 * time.Microsecond, "", "", "", 0, ErrInvalidValue},
				{20 * time.Millisecond, time.Second + time.Microsecond, "", "", "", 0, ErrInvalidValue},
				{20 * time.Millisecond, 0, "", "", "", 0, ErrInvalidValue},
				{MaxCFSQuota + time.Microsecond, time.Second, "", "", "", 0, ErrInvalidValue},
			} {
				err := g.SetCPULimit(tc.quota, tc.period)
				if !errors.Is(err, tc.err) {
					t.Fatalf("SetCPULimit(%v, %v) = %v, want %v", tc.quota, tc.period, err, tc.err)
				}
				if tc.err != nil {
					continue
				}
				if k.layout() == LayoutV2 {
					if got := strings.TrimSpace(mustRead(t, filepath.Join(g.cpuDir(), "cpu.max"))); got != tc.v2 {
						t.Errorf("cpu.max = %q, want %q", got, tc.v2)
					}
				} else {
					q := strings.TrimSpace(mustRead(t, filepath.Join(g.cpuDir(), "cpu.cfs_quota_us")))
					p := strings.TrimSpace(mustRead(t, filepath.Join(g.cpuDir(), "cpu.cfs_period_us")))
					if q != tc.v1q || p != tc.v1p {
						t.Errorf("cfs quota/period = %s/%s, want %s/%s", q, p, tc.v1q, tc.v1p)
					}
				}
				gq, gp, err := g.CPULimit()
				if err != nil || gq != tc.wantQ || gp != tc.period.Truncate(time.Microsecond) {
					t.Errorf("CPULimit = %v, %v, %v; want %v, %v", gq, gp, err, tc.wantQ, tc.period.Truncate(time.Microsecond))
				}
			}
		})
	}
}

func TestCPULimitMalformed(t *testing.T) {
	t.Parallel()
	for _, k := range []fakeKind{fakeV1Separate, fakeV2} {
		h := OpenLayout(newFake(t, k), k.layout())
		g := fakeCreate(t, h, "x")
		file := "cpu.cfs_quota_us"
		if k == fakeV2 {
			file = "cpu.max"
		}
		mustWrite(t, filepath.Join(g.cpuDir(), file), "garbage\n")
		if _, _, err := g.CPULimit(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%v: CPULimit on garbage = %v; want ErrMalformed", k, err)
		}
	}
}

func TestParseCPUMax(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		q, p int64
		ok   bool
	}{
		{"max 100000\n", -1, 100000, true},
		{"20000 100000\n", 20000, 100000, true},
		{"max", 0, 0, false},
		{"20000 0", 0, 0, false},
		{"-5 100000", 0, 0, false},
		{"x 100000", 0, 0, false},
		{"1 2 3", 0, 0, false},
		{"", 0, 0, false},
	} {
		q, p, err := parseCPUMax([]byte(tc.in))
		if (err == nil) != tc.ok || (tc.ok && (q != tc.q || p != tc.p)) {
			t.Errorf("parseCPUMax(%q) = %d, %d, %v", tc.in, q, p, err)
		}
	}
}

func TestSetIdle(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			for _, idle := range []bool{true, false, true} {
				if err := g.SetIdle(idle); err != nil {
					t.Fatalf("SetIdle(%v): %v", idle, err)
				}
				want := "0"
				if idle {
					want = "1"
				}
				if got := strings.TrimSpace(mustRead(t, filepath.Join(g.cpuDir(), "cpu.idle"))); got != want {
					t.Errorf("SetIdle(%v): cpu.idle = %q", idle, got)
				}
			}
		})
	}
}

// Kernels before 5.15 have no cpu.idle: ErrUnsupported, not ErrNotExist.
func TestSetIdleUnsupported(t *testing.T) {
	t.Parallel()
	for _, k := range []fakeKind{fakeV1Separate, fakeHybrid, fakeV2} {
		h := OpenLayout(newFake(t, k), k.layout())
		g := fakeCreate(t, h, "x")
		if err := os.Remove(filepath.Join(g.cpuDir(), "cpu.idle")); err != nil {
			t.Fatal(err)
		}
		err := g.SetIdle(true)
		if !errors.Is(err, ErrUnsupported) || errors.Is(err, ErrNotExist) {
			t.Errorf("%v: SetIdle without cpu.idle = %v; want ErrUnsupported only", k, err)
		}
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			want := CPUStats{Usage: 7*time.Second + 5*time.Microsecond, NrPeriods: 120, NrThrottled: 30, Throttled: 2*time.Second + 7*time.Microsecond}
			if k.layout() == LayoutV2 {
				mustWrite(t, filepath.Join(g.cpuDir(), "cpu.stat"), "usage_usec 7000005\nuser_usec 5000000\nsystem_usec 2000005\n"+
					"core_sched.force_idle_usec 0\nnr_periods 120\nnr_throttled 30\nthrottled_usec 2000007\nnr_bursts 0\nburst_usec 0\n")
			} else {
				mustWrite(t, filepath.Join(g.cpuDir(), "cpu.stat"), "nr_periods 120\nnr_throttled 30\nthrottled_time 2000007000\nnr_bursts 0\nburst_time 0\nwait_sum 12\n")
				mustWrite(t, filepath.Join(g.cpuacctDir(), "cpuacct.usage"), "7000005000\n")
			}
			got, err := g.Stats()
			if err != nil || got != want {
				t.Fatalf("Stats = %+v, %v; want %+v", got, err, want)
			}
		})
	}
}

func TestParseCPUStat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		v2   bool
		want CPUStats
		ok   bool
	}{
		{"v1", "nr_periods 3\nnr_throttled 1\nthrottled_time 1500\n", false, CPUStats{NrPeriods: 3, NrThrottled: 1, Throttled: 1500}, true},
		{"v1 ignores usec keys", "throttled_usec 5\nusage_usec 9\n", false, CPUStats{}, true},
		{"v2 no cpu controller", "usage_usec 10\nuser_usec 4\nsystem_usec 6\n", true, CPUStats{Usage: 10 * time.Microsecond}, true},
		{"v2 missing usage", "nr_periods 1\n", true, CPUStats{}, false},
		{"blank lines", "\nnr_periods 3\n\n", false, CPUStats{NrPeriods: 3}, true},
		{"repeated key", "nr_periods 3\nnr_periods 4\n", false, CPUStats{}, false},
		{"three fields", "nr_periods 3 4\n", false, CPUStats{}, false},
		{"negative", "nr_periods -3\n", false, CPUStats{}, false},
		{"text value", "nr_periods x\n", false, CPUStats{}, false},
		{"ns overflow", "throttled_time 18446744073709551615\n", false, CPUStats{}, false},
		{"us overflow", "usage_usec 9223372036854776\n", true, CPUStats{}, false},
	} {
		got, err := parseCPUStat([]byte(tc.in), tc.v2)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%s: parseCPUStat = %+v, %v; want %+v ok=%v", tc.name, got, err, tc.want, tc.ok)
		}
	}
}

// simKernel models v1 CFS bandwidth validation (tg_cfs_schedulable_down):
// a group's quota/period ratio must not exceed its parent's limit nor fall
// below the largest limited descendant's ratio; "unlimited" inherits the
// parent's limit.
type simKernel struct {
	q, p           int64   // current group setting (µs, q<0 unlimited)
	parentRatio    float64 // 0 = no parent limit
	childQ, childP int64   // the highest-ratio limited descendant; childP 0 = none
	writes         []string
	rejected       int
	unlimitedWrite bool // a -1 quota was accepted
}

var _ cfsIO = (*simKernel)(nil)

func (s *simKernel) readCFS() (int64, int64, error) { return s.q, s.p, nil }

func (s *simKernel) floor() (int64, int64, error) {
	if s.childP == 0 {
		return -1, 1, nil
	}
	return s.childQ, s.childP, nil
}

func (s *simKernel) childRatio() float64 {
	if s.childP == 0 {
		return 0
	}
	return float64(s.childQ) / float64(s.childP)
}

func (s *simKernel) effective(q, p int64) float64 {
	if q < 0 {
		if s.parentRatio == 0 {
			return 1e18
		}
		return s.parentRatio
	}
	return float64(q) / float64(p)
}

func (s *simKernel) valid(q, p int64) bool {
	r := s.effective(q, p)
	return !(s.parentRatio > 0 && q >= 0 && r > s.parentRatio) && !(s.childRatio() > 0 && r < s.childRatio())
}

func (s *simKernel) writeCFS(f cfsFile, v int64) error {
	q, p := s.q, s.p
	if f == cfsQuota {
		q = v
	} else {
		p = v
	}
	s.writes = append(s.writes, fmt.Sprintf("%s=%d", f, v))
	if !s.valid(q, p) {
		s.rejected++
		return fmt.Errorf("write %s: %w", f, syscall.EINVAL)
	}
	if f == cfsQuota && v < 0 {
		s.unlimitedWrite = true
	}
	s.q, s.p = q, p
	return nil
}

func TestApplyCFSOrdering(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		k              simKernel
		nq, np         int64
		wantRejected   int
		wantWrites     int
		wantErr        error // nil, ErrClamped or ErrInvalidValue (kernel refusal)
		wantQ, wantP   int64
		wantFirstWrite string
	}{
		// Parent allows 0.5 CPU. 40ms/100ms -> 4ms/10ms (same 0.4): writing the
		// period first would pass through 40ms/10ms = 4 CPUs.
		{name: "shrink period under parent", k: simKernel{q: 40000, p: 100000, parentRatio: 0.5}, nq: 4000, np: 10000,
			wantWrites: 2, wantQ: 4000, wantP: 10000, wantFirstWrite: "cpu.cfs_quota_us=4000"},
		// And back: quota first would pass through 40ms/10ms.
		{name: "grow period under parent", k: simKernel{q: 4000, p: 10000, parentRatio: 0.5}, nq: 40000, np: 100000,
			wantWrites: 2, wantQ: 40000, wantP: 100000, wantFirstWrite: "cpu.cfs_period_us=100000"},
		{name: "ratio up within parent", k: simKernel{q: 10000, p: 100000, parentRatio: 0.5}, nq: 20000, np: 50000,
			wantWrites: 2, wantQ: 20000, wantP: 50000},
		{name: "same period", k: simKernel{q: 10000, p: 100000, parentRatio: 0.5}, nq: 30000, np: 100000,
			wantWrites: 1, wantQ: 30000, wantP: 100000},
		{name: "unchanged writes nothing", k: simKernel{q: 10000, p: 100000}, nq: 10000, np: 100000,
			wantWrites: 0, wantQ: 10000, wantP: 100000},
		{name: "unlimited unchanged writes nothing", k: simKernel{q: -1, p: 100000}, nq: -1, np: 100000,
			wantWrites: 0, wantQ: -1, wantP: 100000},
		{name: "to unlimited", k: simKernel{q: 10000, p: 100000, parentRatio: 0.5}, nq: -1, np: 10000,
			wantWrites: 2, wantQ: -1, wantP: 10000, wantFirstWrite: "cpu.cfs_quota_us=-1"},
		{name: "from unlimited", k: simKernel{q: -1, p: 100000, parentRatio: 0.5}, nq: 4000, np: 10000,
			wantWrites: 2, wantQ: 4000, wantP: 10000, wantFirstWrite: "cpu.cfs_period_us=10000"},
		// The bug: a cut below a child's own quota. It used to pass through -1
		// (and end there when -1 was the old value). Now: clamped to the child.
		{name: "cut below child clamps", k: simKernel{q: 80000, p: 100000, childQ: 50000, childP: 100000}, nq: 10000, np: 100000,
			wantRejected: 1, wantWrites: 2, wantErr: ErrClamped, wantQ: 50000, wantP: 100000},
		{name: "cut below child from unlimited", k: simKernel{q: -1, p: 100000, childQ: 50000, childP: 100000}, nq: 10000, np: 100000,
			wantRejected: 1, wantWrites: 2, wantErr: ErrClamped, wantQ: 50000, wantP: 100000},
		// Child ratios normalise across periods: 5ms/10ms is 0.5 at 100ms.
		{name: "clamp normalises the child's period", k: simKernel{q: 80000, p: 100000, childQ: 5000, childP: 10000}, nq: 20000, np: 100000,
			wantRejected: 1, wantWrites: 2, wantErr: ErrClamped, wantQ: 50000, wantP: 100000},
		{name: "clamp rounds up", k: simKernel{q: 90000, p: 100000, childQ: 1000, childP: 3000}, nq: 10000, np: 100000,
			wantRejected: 1, wantWrites: 2, wantErr: ErrClamped, wantQ: 33334, wantP: 100000},
		// Cut with a period change, no parent limit: the quota-first plan dips
		// below the child, the other order reaches the clamped target.
		{name: "cut below child with period change", k: simKernel{q: 80000, p: 100000, childQ: 50000, childP: 100000}, nq: 2000, np: 10000,
			wantErr: ErrClamped, wantQ: 5000, wantP: 10000},
		// Same ratio, both orders leave [child, parent]: no two-write order
		// exists without -1, so the period stays and ErrClamped says so.
		{name: "impossible period change keeps period", k: simKernel{q: 50000, p: 100000, parentRatio: 0.6, childQ: 45000, childP: 100000}, nq: 25000, np: 50000,
			wantRejected: 2, wantWrites: 2, wantErr: ErrClamped, wantQ: 50000, wantP: 100000},
		// A target that is fine for the child but not the parent: refused, kept.
		{name: "infeasible restores", k: simKernel{q: 10000, p: 100000, parentRatio: 0.5}, nq: 90000, np: 100000,
			wantErr: ErrInvalidValue, wantQ: 10000, wantP: 100000},
		{name: "infeasible with period change restores", k: simKernel{q: 10000, p: 100000, parentRatio: 0.5, childQ: 5000, childP: 100000},
			nq: 9000, np: 10000, wantErr: ErrInvalidValue, wantQ: 10000, wantP: 100000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := tc.k
			oq := k.q
			err := applyCFS(&k, tc.nq, tc.np)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("applyCFS = %v (writes %v)", err, k.writes)
			case tc.wantErr == ErrInvalidValue && !errors.Is(err, syscall.EINVAL):
				t.Fatalf("applyCFS = %v; want the kernel's EINVAL (writes %v)", err, k.writes)
			case tc.wantErr == ErrClamped:
				var ce *ClampError
				if !errors.Is(err, ErrClamped) || !errors.As(err, &ce) {
					t.Fatalf("applyCFS = %v; want a *ClampError (writes %v)", err, k.writes)
				}
				want := CFSLimit{time.Duration(tc.wantQ) * time.Microsecond, time.Duration(tc.wantP) * time.Microsecond}
				wanted := CFSLimit{time.Duration(tc.nq) * time.Microsecond, time.Duration(tc.np) * time.Microsecond}
				if ce.Applied != want || ce.Wanted != wanted {
					t.Fatalf("ClampError %+v; want Applied %+v, Wanted %+v", ce, want, wanted)
				}
			}
			if k.q != tc.wantQ || k.p != tc.wantP {
				t.Fatalf("final %d/%d, want %d/%d (writes %v)", k.q, k.p, tc.wantQ, tc.wantP, k.writes)
			}
			if k.unlimitedWrite && oq >= 0 && tc.nq >= 0 {
				t.Fatalf("a limited group passed through unlimited: writes %v", k.writes)
			}
			if tc.wantErr == ErrInvalidValue {
				return
			}
			if tc.wantRejected != 0 && k.rejected != tc.wantRejected {
				t.Errorf("%d rejected writes, want %d (writes %v)", k.rejected, tc.wantRejected, k.writes)
			}
			if tc.wantWrites != 0 && len(k.writes) != tc.wantWrites || tc.wantWrites == 0 && tc.wantErr == nil && tc.wantRejected == 0 && k.rejected != 0 {
				t.Errorf("%d writes, want %d: %v", len(k.writes), tc.wantWrites, k.writes)
			}
			if tc.wantFirstWrite != "" && (len(k.writes) == 0 || k.writes[0] != tc.wantFirstWrite) {
				t.Errorf("writes %v, want first %s", k.writes, tc.wantFirstWrite)
			}
		})
	}
}

// Property, over a grid of parents, children, old and new settings that the
// kernel accepts: applyCFS never writes -1 between two limits; it reaches
// the target, or clamps to a valid setting no lower than both the target
// and the child's ratio, or (target above the parent) keeps the old one.
func TestApplyCFSNeverUnlimited(t *testing.T) {
	t.Parallel()
	periods := []int64{1000, 10000, 50000, 100000, 1000000}
	quotas := []int64{-1, 1000, 5000, 20000, 50000, 100000, 400000}
	children := [][2]int64{{0, 0}, {5000, 100000}, {50000, 100000}, {4500, 10000}, {300000, 1000000}}
	for _, parent := range []float64{0, 0.5, 1} {
		for _, c := range children {
			for _, op := range periods {
				for _, oq := range quotas {
					for _, np := range periods {
						for _, nq := range quotas {
							k := simKernel{q: oq, p: op, parentRatio: parent, childQ: c[0], childP: c[1]}
							if !k.valid(oq, op) {
								continue
							}
							err := applyCFS(&k, nq, np)
							desc := fmt.Sprintf("parent %.2f child %v: %d/%d -> %d/%d: err %v, writes %v", parent, c, oq, op, nq, np, err, k.writes)
							if k.unlimitedWrite && oq >= 0 && nq >= 0 {
								t.Fatalf("%s: passed through unlimited", desc)
							}
							if !k.valid(k.q, k.p) {
								t.Fatalf("%s: ended invalid at %d/%d", desc, k.q, k.p)
							}
							var ce *ClampError
							switch {
							case err == nil:
								if k.q != nq && !(nq < 0 && k.q < 0) || k.p != np {
									t.Fatalf("%s: nil error but at %d/%d", desc, k.q, k.p)
								}
							case errors.As(err, &ce):
								if ce.Applied.Quota != time.Duration(k.q)*time.Microsecond || ce.Applied.Period != time.Duration(k.p)*time.Microsecond {
									t.Fatalf("%s: Applied %+v but at %d/%d", desc, ce.Applied, k.q, k.p)
								}
								if k.q < 0 || ratioLess(k.q, k.p, nq, np) {
									t.Fatalf("%s: clamped below the target to %d/%d", desc, k.q, k.p)
								}
							default:
								if !errors.Is(err, syscall.EINVAL) || k.q != oq || k.p != op {
									t.Fatalf("%s: refused but at %d/%d", desc, k.q, k.p)
								}
							}
						}
					}
				}
			}
		}
	}
}

func TestRatioMath(t *testing.T) {
	t.Parallel()
	if !ratioLess(1, 3, 33334, 100000) || ratioLess(33334, 100000, 1, 3) || ratioLess(1, 2, 5, 10) {
		t.Fatal("ratioLess")
	}
	big := MaxCFSQuota.Microseconds()
	if !ratioLess(big-1, 1000000, big, 1000000) {
		t.Fatal("ratioLess near the maximum quota")
	}
	for _, tc := range []struct{ q, np, p, want int64 }{
		{1, 100000, 3, 33334}, {5000, 100000, 10000, 50000}, {50000, 10000, 100000, 5000},
		{big, 1000000, 1000, big * 1000},
	} {
		if got := scaleCeil(tc.q, tc.np, tc.p); got != tc.want {
			t.Errorf("scaleCeil(%d, %d, %d) = %d, want %d", tc.q, tc.np, tc.p, got, tc.want)
		}
	}
	if got := scaleCeil(math.MaxInt64, math.MaxInt64, 1); got != math.MaxInt64 {
		t.Errorf("scaleCeil overflow = %d, want saturation", got)
	}
}

// Exhaustive-ish property: for any feasible target under a parent limit
// and no child limit, the planned order never needs the fallback.
func TestPlanCFSNeverRejectedUnderParent(t *testing.T) {
	t.Parallel()
	periods := []int64{1000, 10000, 50000, 100000, 250000, 1000000}
	quotas := []int64{-1, 1000, 5000, 20000, 40000, 100000, 400000}
	for _, parent := range []float64{0.1, 0.5, 1, 2} {
		for _, op := range periods {
			for _, oq := range quotas {
				if oq >= 0 && float64(oq)/float64(op) > parent {
					continue
				}
				for _, np := range periods {
					for _, nq := range quotas {
						if nq >= 0 && float64(nq)/float64(np) > parent {
							continue
						}
						k := simKernel{q: oq, p: op, parentRatio: parent}
						if err := applyCFS(&k, nq, np); err != nil || k.q != nq || k.p != np {
							t.Fatalf("parent %.2f: %d/%d -> %d/%d: err %v, final %d/%d", parent, oq, op, nq, np, err, k.q, k.p)
						}
						if k.rejected != 0 {
							t.Fatalf("parent %.2f: %d/%d -> %d/%d: %d transient rejections: %v", parent, oq, op, nq, np, k.rejected, k.writes)
						}
					}
				}
			}
		}
	}
}

// Idle reads back what SetIdle wrote; how the agent tells its own in-place
// batch pod cgroups (kubelet never sets cpu.idle) from kubelet's.
func TestIdle(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			g := fakeCreate(t, OpenLayout(newFake(t, k), k.layout()), "kubepods/besteffort/podx")
			for _, want := range []bool{false, true, false} {
				if want {
					if err := g.SetIdle(true); err != nil {
						t.Fatal(err)
					}
				} else if err := g.SetIdle(false); err != nil {
					t.Fatal(err)
				}
				if got, err := g.Idle(); err != nil || got != want {
					t.Fatalf("Idle = %v, %v; want %v", got, err, want)
				}
			}
			mustWrite(t, filepath.Join(g.cpuDir(), "cpu.idle"), "yes\n")
			if _, err := g.Idle(); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Idle on garbage = %v; want ErrMalformed", err)
			}
			if err := os.Remove(filepath.Join(g.cpuDir(), "cpu.idle")); err != nil {
				t.Fatal(err)
			}
			if _, err := g.Idle(); !errors.Is(err, ErrUnsupported) {
				t.Fatalf("Idle without cpu.idle = %v; want ErrUnsupported", err)
			}
		})
	}
}
