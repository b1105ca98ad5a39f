package cgroups

import (
	"bytes"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func FuzzParsePSI(f *testing.F) {
	for _, s := range []string{
		"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"some avg10=46.82 avg60=52.24 avg300=23.97 total=95366992\n",
		"some avg10=100.00 avg60=0 avg300=0 total=18446744073709551615\n",
		"some total=1 avg300=1 avg60=1 avg10=1 x=y\n",
		"full avg10=1e2 avg60=0x1p-2 avg300=-0 total=0\n",
		"", "some", "some avg10=NaN", "\n\n\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := ParsePSI(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			if p != (PSI{}) {
				t.Fatalf("error with non-zero result %+v", p)
			}
			return
		}
		for _, l := range []PSILine{p.Some, p.Full} {
			for _, v := range []float64{l.Avg10, l.Avg60, l.Avg300} {
				if math.IsNaN(v) || v < 0 || v > 100 {
					t.Fatalf("accepted average %v", v)
				}
			}
			if l.Total < 0 {
				t.Fatalf("accepted negative total %v", l.Total)
			}
		}
	})
}

// Property: an accepted path is returned unchanged, is local, and joined to
// any root stays strictly inside it.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"kubepods", "kubepods/besteffort/x", "..", "../x", "a/../../b", "/abs", "a//b", "a/./b", "a\x00b", ".", "", "a/..", "...", "a/...", "\\..\\x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := CleanPath(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("error %v does not wrap ErrInvalidPath", err)
			}
			return
		}
		if out != in {
			t.Fatalf("CleanPath(%q) changed it to %q", in, out)
		}
		if !filepath.IsLocal(out) {
			t.Fatalf("accepted non-local %q", out)
		}
		const root = "/sys/fs/cgroup/cpu"
		j := filepath.Join(root, out)
		if j == root || !strings.HasPrefix(j, root+"/") {
			t.Fatalf("%q escapes %s: %s", in, root, j)
		}
		for _, c := range []byte(out) {
			if c < 0x20 || c == 0x7f {
				t.Fatalf("accepted control byte in %q", out)
			}
		}
	})
}

// Property: any accepted UID yields a clean path strictly below the QoS
// cgroup, one component deeper, whose last component carries the UID.
func FuzzPodPath(f *testing.F) {
	for _, s := range []string{"8dbc9e11-dc93-4eb2-bbef-ed21cf1db420", "../../x", "a/b", "", "..", "a\x00", "pod", "a_b.c-d", strings.Repeat("z", 200)} {
		f.Add(s, uint8(0), false)
	}
	f.Fuzz(func(t *testing.T, uid string, q uint8, systemd bool) {
		d := DriverCgroupfs
		if systemd {
			d = DriverSystemd
		}
		qos := KubeQOS(q%3 + 1)
		n := Naming{Driver: d}
		p, err := n.PodPath(qos, uid)
		if err != nil {
			if !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("error %v does not wrap ErrInvalidPath", err)
			}
			return
		}
		if _, err := CleanPath(p); err != nil {
			t.Fatalf("PodPath(%q) = %q is not clean: %v", uid, p, err)
		}
		parent := n.QOSPath(qos)
		if filepath.Dir(p) != parent {
			t.Fatalf("PodPath(%q) = %q is not a direct child of %q", uid, p, parent)
		}
		want := "pod" + uid
		if systemd {
			want = strings.ReplaceAll(want, "-", "_") + ".slice"
		}
		if !strings.HasSuffix(filepath.Base(p), want) {
			t.Fatalf("PodPath(%q) = %q does not end in %q", uid, p, want)
		}
		// Tier names follow the same rules plus the "pod" ban.
		if tp, err := n.TierPathIn(QOSBestEffort, uid); err == nil {
			if filepath.Dir(tp) != n.QOSPath(QOSBestEffort) {
				t.Fatalf("TierPathIn(BestEffort, %q) = %q is not a child of BestEffort", uid, tp)
			}
			if strings.Contains(strings.ToLower(uid), "pod") {
				t.Fatalf("TierPathIn accepted %q", uid)
			}
		}
	})
}

func FuzzParseCPUStat(f *testing.F) {
	f.Add([]byte("usage_usec 7\nuser_usec 1\nnr_periods 2\nnr_throttled 1\nthrottled_usec 3\n"), true)
	f.Add([]byte("nr_periods 2\nnr_throttled 1\nthrottled_time 3\n"), false)
	f.Add([]byte("usage_usec 18446744073709551615\n"), true)
	f.Fuzz(func(t *testing.T, b []byte, v2 bool) {
		st, err := parseCPUStat(b, v2)
		if err != nil {
			return
		}
		if st.Usage < 0 || st.Throttled < 0 {
			t.Fatalf("negative durations %+v", st)
		}
		if v2 {
			us, uerr := parseUsageUsec(b)
			// The fast reader sees the first usage_usec line; the full parser
			// rejects repeats, so both agree whenever both accept.
			if uerr == nil && bytes.Count(b, []byte("usage_usec")) == 1 {
				if d, derr := usDuration(us); derr == nil && d != st.Usage {
					t.Fatalf("fast reader %v != parser %v", d, st.Usage)
				}
			}
		}
	})
}

func FuzzParseCPUMax(f *testing.F) {
	for _, s := range []string{"max 100000\n", "20000 100000", "max", "-1 1", "1 -1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, p, err := parseCPUMax([]byte(s))
		if err != nil {
			return
		}
		if p <= 0 || q < -1 {
			t.Fatalf("parseCPUMax(%q) = %d, %d", s, q, p)
		}
	})
}

// Memory event and limit parsers read kernel files: never panic, and an
// accepted v1 oom_control has under_oom 0/1.
func FuzzParseMemoryFiles(f *testing.F) {
	for _, s := range []string{
		"low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
		"oom_kill_disable 0\nunder_oom 1\noom_kill 4\n", "under_oom 2\n", "oom_kill 1\noom_kill 1\n",
		"max", "-1", "9223372036854771712", "1048576\n", "", " \n", "oom_kill 18446744073709551615\nunder_oom 0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		_, _ = parseMemoryEventsV2([]byte(in))
		if ev, err := parseOOMControl([]byte(in)); err == nil && ev.UnderOOM && !strings.Contains(in, "under_oom") {
			t.Fatalf("UnderOOM without an under_oom line: %q", in)
		}
		if v, err := parseMemValue([]byte(in)); err == nil && v < 0 && v != UnlimitedMemory {
			t.Fatalf("parseMemValue(%q) = %d", in, v)
		}
	})
}
