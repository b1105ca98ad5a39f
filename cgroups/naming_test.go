package cgroups

import (
	"errors"
	"strings"
	"testing"
)

func TestParseDriver(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Driver
		err  error
	}{
		{"cgroupfs", DriverCgroupfs, nil},
		{"systemd", DriverSystemd, nil},
		{"", "", ErrInvalidDriver},
		{"Systemd", "", ErrInvalidDriver},
		{" systemd", "", ErrInvalidDriver},
		{"cgroupfs\n", "", ErrInvalidDriver},
		{"none", "", ErrInvalidDriver},
	} {
		got, err := ParseDriver(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("ParseDriver(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// Golden names exactly as kubelet creates them (pkg/kubelet/cm: cgroupfs
// joins the components; systemd escapes '-' to '_' and expands the slice).
func TestQOSPathGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    Driver
		q    KubeQOS
		want string
	}{
		{DriverCgroupfs, QOSGuaranteed, "kubepods"},
		{DriverCgroupfs, QOSBurstable, "kubepods/burstable"},
		{DriverCgroupfs, QOSBestEffort, "kubepods/besteffort"},
		{DriverSystemd, QOSGuaranteed, "kubepods.slice"},
		{DriverSystemd, QOSBurstable, "kubepods.slice/kubepods-burstable.slice"},
		{DriverSystemd, QOSBestEffort, "kubepods.slice/kubepods-besteffort.slice"},
		{DriverSystemd, KubeQOS(0), ""},
		{DriverCgroupfs, KubeQOS(7), ""},
		{Driver("bogus"), QOSBurstable, ""},
	} {
		if got := QOSPath(tc.d, tc.q); got != tc.want {
			t.Errorf("QOSPath(%s, %v) = %q, want %q", tc.d, tc.q, got, tc.want)
		}
	}
}

func TestPodPathGolden(t *testing.T) {
	t.Parallel()
	const uid = "8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"
	const staticUID = "0f2c6d5c9e3a4b1f8a7d6e5c4b3a2910" // static pods: config hash
	for _, tc := range []struct {
		d    Driver
		q    KubeQOS
		uid  string
		want string
	}{
		{DriverCgroupfs, QOSGuaranteed, uid, "kubepods/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverCgroupfs, QOSBurstable, uid, "kubepods/burstable/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverCgroupfs, QOSBestEffort, uid, "kubepods/besteffort/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverSystemd, QOSGuaranteed, uid, "kubepods.slice/kubepods-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, QOSBurstable, uid, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, QOSBestEffort, uid, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverCgroupfs, QOSBurstable, staticUID, "kubepods/burstable/pod0f2c6d5c9e3a4b1f8a7d6e5c4b3a2910"},
		{DriverSystemd, QOSBurstable, staticUID, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f2c6d5c9e3a4b1f8a7d6e5c4b3a2910.slice"},
	} {
		got, err := PodPath(tc.d, tc.q, tc.uid)
		if err != nil || got != tc.want {
			t.Errorf("PodPath(%s, %v, %q) = %q, %v; want %q", tc.d, tc.q, tc.uid, got, err, tc.want)
		}
		if _, err := CleanPath(got); err != nil {
			t.Errorf("PodPath result %q is not a clean path: %v", got, err)
		}
	}
}

func TestPodPathRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		d    Driver
		q    KubeQOS
		uid  string
		err  error
	}{
		{"empty", DriverCgroupfs, QOSBurstable, "", ErrInvalidPath},
		{"parent escape", DriverCgroupfs, QOSBurstable, "../../x", ErrInvalidPath},
		{"dotdot", DriverSystemd, QOSBurstable, "..", ErrInvalidPath},
		{"dot", DriverCgroupfs, QOSBurstable, ".", ErrInvalidPath},
		{"embedded dotdot", DriverCgroupfs, QOSBestEffort, "a..b", ErrInvalidPath},
		{"slash", DriverCgroupfs, QOSBurstable, "a/b", ErrInvalidPath},
		{"leading slash", DriverSystemd, QOSBurstable, "/etc", ErrInvalidPath},
		{"NUL", DriverCgroupfs, QOSBurstable, "a\x00b", ErrInvalidPath},
		{"space", DriverCgroupfs, QOSBurstable, "a b", ErrInvalidPath},
		{"tab", DriverCgroupfs, QOSBurstable, "a\tb", ErrInvalidPath},
		{"newline", DriverSystemd, QOSBurstable, "a\nb", ErrInvalidPath},
		{"non-ascii", DriverCgroupfs, QOSBurstable, "pödé", ErrInvalidPath},
		{"backslash", DriverCgroupfs, QOSBurstable, `a\b`, ErrInvalidPath},
		{"hidden", DriverCgroupfs, QOSBurstable, ".hidden", ErrInvalidPath},
		{"too long", DriverCgroupfs, QOSBurstable, strings.Repeat("a", MaxNameLen+1), ErrInvalidPath},
		{"bad qos", DriverCgroupfs, KubeQOS(0), "abc", ErrInvalidValue},
		{"bad driver", Driver("x"), QOSBurstable, "abc", ErrInvalidDriver},
	} {
		got, err := PodPath(tc.d, tc.q, tc.uid)
		if !errors.Is(err, tc.err) || got != "" {
			t.Errorf("%s: PodPath(%s, %v, %q) = %q, %v; want error %v", tc.name, tc.d, tc.q, tc.uid, got, err, tc.err)
		}
	}
	// The longest accepted UID still yields a valid path.
	long := strings.Repeat("a", MaxNameLen)
	p, err := PodPath(DriverSystemd, QOSBestEffort, long)
	if err != nil {
		t.Fatalf("PodPath(max len): %v", err)
	}
	if _, err := CleanPath(p); err != nil {
		t.Fatalf("CleanPath(%q): %v", p, err)
	}
}

func TestTierPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    Driver
		name string
		want string
		err  error
	}{
		{DriverCgroupfs, DefaultTierName, "kubepods/besteffort/understory-batch", nil},
		// kubelet escaping: '-' -> '_' inside a component, so kubelet parses
		// the slice back to the single component "understory-batch".
		{DriverSystemd, DefaultTierName, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-understory_batch.slice", nil},
		{DriverCgroupfs, "batch", "kubepods/besteffort/batch", nil},
		{DriverSystemd, "batch.v2", "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-batch.v2.slice", nil},
		// kubelet's orphan cleanup would delete anything named pod*.
		{DriverCgroupfs, "pod", "", ErrInvalidPath},
		{DriverCgroupfs, "podbatch", "", ErrInvalidPath},
		{DriverSystemd, "pod-batch", "", ErrInvalidPath},
		{DriverCgroupfs, "Pod-batch", "", ErrInvalidPath},
		{DriverCgroupfs, "POD", "", ErrInvalidPath},
		{DriverCgroupfs, "po", "kubepods/besteffort/po", nil},
		// kubelet matches "pod" anywhere in the name, then splits on it.
		{DriverCgroupfs, "batchpodtier", "", ErrInvalidPath},
		{DriverCgroupfs, "my-Pod", "", ErrInvalidPath},
		{DriverCgroupfs, "under_score", "", ErrInvalidPath},
		{DriverCgroupfs, "", "", ErrInvalidPath},
		{DriverCgroupfs, "a/b", "", ErrInvalidPath},
		{DriverCgroupfs, "..", "", ErrInvalidPath},
		{DriverCgroupfs, "../../etc", "", ErrInvalidPath},
		{DriverSystemd, "x\x00", "", ErrInvalidPath},
		{Driver("other"), "batch", "", ErrInvalidDriver},
	} {
		got, err := TierPath(tc.d, tc.name)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("TierPath(%s, %q) = %q, %v; want %q, %v", tc.d, tc.name, got, err, tc.want, tc.err)
		}
	}
}

func TestTierPathIn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    Driver
		q    KubeQOS
		want string
		err  error
	}{
		{DriverCgroupfs, QOSGuaranteed, "kubepods/understory-batch", nil},
		{DriverSystemd, QOSGuaranteed, "kubepods.slice/kubepods-understory_batch.slice", nil},
		{DriverCgroupfs, QOSBestEffort, "kubepods/besteffort/understory-batch", nil},
		{DriverSystemd, QOSBurstable, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-understory_batch.slice", nil},
		{DriverCgroupfs, KubeQOS(0), "", ErrInvalidValue},
	} {
		got, err := TierPathIn(tc.d, tc.q, DefaultTierName)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("TierPathIn(%s, %v) = %q, %v; want %q, %v", tc.d, tc.q, got, err, tc.want, tc.err)
		}
	}
}

func TestCleanPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"kubepods", true},
		{"kubepods/besteffort/understory-batch", true},
		{"kubepods.slice/kubepods-besteffort.slice/x.slice", true},
		{"a b/c", true}, // spaces are legal cgroup names
		{"", false},
		{".", false},
		{"..", false},
		{"/kubepods", false},
		{"kubepods/", false},
		{"kubepods//x", false},
		{"kubepods/./x", false},
		{"kubepods/../x", false},
		{"a/../../x", false},
		{"../x", false},
		{"x/..", false},
		{"a\x00b", false},
		{"a\nb", false},
		{"a\x7fb", false},
		{"a\tb", false},
		{strings.Repeat("a", 256), false},
		{strings.Repeat("a", 255), true},
		{strings.Repeat("a/", 2000) + "a", false},
	} {
		got, err := CleanPath(tc.in)
		if tc.ok {
			if err != nil || got != tc.in {
				t.Errorf("CleanPath(%q) = %q, %v; want accepted unchanged", tc.in, got, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidPath) {
			t.Errorf("CleanPath(%q) = %q, %v; want ErrInvalidPath", tc.in, got, err)
		}
	}
}

func TestKubeQOSString(t *testing.T) {
	t.Parallel()
	for q, want := range map[KubeQOS]string{QOSGuaranteed: "Guaranteed", QOSBurstable: "Burstable", QOSBestEffort: "BestEffort", 0: "KubeQOS(0)"} {
		if got := q.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(q), got, want)
		}
	}
}

func TestPodUIDFromDir(t *testing.T) {
	t.Parallel()
	const uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	tests := []struct {
		name   string
		d      Driver
		q      KubeQOS
		dir    string
		want   string
		wantOK bool
	}{
		{"cgroupfs burstable", DriverCgroupfs, QOSBurstable, "pod" + uid, uid, true},
		{"cgroupfs guaranteed", DriverCgroupfs, QOSGuaranteed, "pod" + uid, uid, true},
		{"systemd besteffort", DriverSystemd, QOSBestEffort, "kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice", uid, true},
		{"systemd guaranteed", DriverSystemd, QOSGuaranteed, "kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice", uid, true},
		{"systemd wrong qos prefix", DriverSystemd, QOSBurstable, "kubepods-besteffort-pod" + uid + ".slice", "", false},
		{"tier is no pod", DriverCgroupfs, QOSGuaranteed, "understory-batch", "", false},
		{"qos dir is no pod", DriverCgroupfs, QOSGuaranteed, "burstable", "", false},
		{"empty uid", DriverCgroupfs, QOSBurstable, "pod", "", false},
		{"unsafe uid", DriverCgroupfs, QOSBurstable, "pod..", "", false},
		{"systemd missing suffix", DriverSystemd, QOSBestEffort, "kubepods-besteffort-pod" + uid, "", false},
		{"bad driver", Driver("x"), QOSBurstable, "pod" + uid, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := PodUIDFromDir(tt.d, tt.q, tt.dir)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("PodUIDFromDir(%q) = %q, %v; want %q, %v", tt.dir, got, ok, tt.want, tt.wantOK)
			}
			if ok {
				p, err := PodPath(tt.d, tt.q, got)
				if err != nil || !strings.HasSuffix(p, "/"+tt.dir) {
					t.Fatalf("PodPath round trip: %q, %v; want suffix %q", p, err, tt.dir)
				}
			}
		})
	}
}

// A tier named like one of kubelet's own cgroups would be that cgroup: "besteffort"
// below kubepods is kubelet's BestEffort cgroup, whose cpu.idle the agent must never set.
func TestTierPathInRejectsKubeletNames(t *testing.T) {
	t.Parallel()
	for _, d := range []Driver{DriverCgroupfs, DriverSystemd} {
		for _, q := range []KubeQOS{QOSGuaranteed, QOSBurstable, QOSBestEffort} {
			for _, name := range []string{"kubepods", "burstable", "besteffort"} {
				got, err := TierPathIn(d, q, name)
				if !errors.Is(err, ErrInvalidPath) {
					t.Errorf("TierPathIn(%s, %v, %q) = %q, %v; want ErrInvalidPath", d, q, name, got, err)
				}
			}
		}
	}
}
