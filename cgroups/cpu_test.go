package cgroups

import (
	"errors"
	"fmt"
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
// below the largest child ratio; "unlimited" inherits the parent's limit.
type simKernel struct {
	q, p          int64   // current group setting (µs, q<0 unlimited)
	parentRatio   float64 // 0 = no parent limit
	childRatio    float64 // 0 = no child with a limit
	writes        []string
	rejected      int
	failFinalOnce bool
}

var _ cfsIO = (*simKernel)(nil)

func (s *simKernel) readCFS() (int64, int64, error) { return s.q, s.p, nil }

func (s *simKernel) effective(q, p int64) float64 {
	if q < 0 {
		if s.parentRatio == 0 {
			return 1e18
		}
		return s.parentRatio
	}
	return float64(q) / float64(p)
}

func (s *simKernel) writeCFS(f cfsFile, v int64) error {
	q, p := s.q, s.p
	if f == cfsQuota {
		q = v
	} else {
		p = v
	}
	s.writes = append(s.writes, fmt.Sprintf("%s=%d", f, v))
	r := s.effective(q, p)
	if (s.parentRatio > 0 && q >= 0 && r > s.parentRatio) || (s.childRatio > 0 && r < s.childRatio) {
		s.rejected++
		return fmt.Errorf("write %s: %w", f, syscall.EINVAL)
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
		wantErr        bool
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
		// Same ratio, both orders leave [lo,hi] and the lower one is below a
		// child's 0.45: the fallback through unlimited gets there.
		{name: "child limit forces fallback", k: simKernel{q: 50000, p: 100000, parentRatio: 0.6, childRatio: 0.45}, nq: 25000, np: 50000,
			wantRejected: 1, wantWrites: 4, wantQ: 25000, wantP: 50000},
		// Target above the parent: rejected, old value restored.
		{name: "infeasible restores", k: simKernel{q: 10000, p: 100000, parentRatio: 0.5}, nq: 90000, np: 100000,
			wantErr: true, wantQ: 10000, wantP: 100000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := tc.k
			err := applyCFS(&k, tc.nq, tc.np)
			if (err != nil) != tc.wantErr {
				t.Fatalf("applyCFS = %v (writes %v)", err, k.writes)
			}
			if tc.wantErr && !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("error %v does not wrap EINVAL", err)
			}
			if k.q != tc.wantQ || k.p != tc.wantP {
				t.Fatalf("final %d/%d, want %d/%d (writes %v)", k.q, k.p, tc.wantQ, tc.wantP, k.writes)
			}
			if tc.wantErr {
				return
			}
			if k.rejected != tc.wantRejected {
				t.Errorf("%d rejected writes, want %d (writes %v)", k.rejected, tc.wantRejected, k.writes)
			}
			if len(k.writes) != tc.wantWrites {
				t.Errorf("%d writes, want %d: %v", len(k.writes), tc.wantWrites, k.writes)
			}
			if tc.wantFirstWrite != "" && (len(k.writes) == 0 || k.writes[0] != tc.wantFirstWrite) {
				t.Errorf("writes %v, want first %s", k.writes, tc.wantFirstWrite)
			}
		})
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
