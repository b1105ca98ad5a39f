package cgroups

import (
	"errors"
	"path"
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

// Golden names exactly as kubelet creates them (pkg/kubelet/cm: the root's
// components, then kubepods and the class; cgroupfs joins the components;
// systemd escapes '-' to '_' and expands the slice).
func TestQOSPathGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    Driver
		root string
		q    KubeQOS
		want string
	}{
		{DriverCgroupfs, "/", QOSGuaranteed, "kubepods"},
		{DriverCgroupfs, "/", QOSBurstable, "kubepods/burstable"},
		{DriverCgroupfs, "", QOSBestEffort, "kubepods/besteffort"},
		{DriverSystemd, "/", QOSGuaranteed, "kubepods.slice"},
		{DriverSystemd, "/", QOSBurstable, "kubepods.slice/kubepods-burstable.slice"},
		{DriverSystemd, "", QOSBestEffort, "kubepods.slice/kubepods-besteffort.slice"},
		// Below a --cgroup-root: kind's /kubelet, and two levels.
		{DriverCgroupfs, "/kubelet", QOSGuaranteed, "kubelet/kubepods"},
		{DriverCgroupfs, "/a/b", QOSBestEffort, "a/b/kubepods/besteffort"},
		{DriverSystemd, "/kubelet", QOSGuaranteed, "kubelet.slice/kubelet-kubepods.slice"},
		{DriverSystemd, "/kubelet", QOSBurstable, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice"},
		{DriverSystemd, "/kubelet", QOSBestEffort, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"},
		{DriverSystemd, "/a/b", QOSGuaranteed, "a.slice/a-b.slice/a-b-kubepods.slice"},
		{DriverSystemd, "/a/b", QOSBurstable, "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-burstable.slice"},
		{DriverSystemd, "/a/b", QOSBestEffort, "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice"},
		{DriverSystemd, "/KubeLet", QOSGuaranteed, "KubeLet.slice/KubeLet-kubepods.slice"},
		// kubelet escapes a root component's '-' like any other.
		{DriverSystemd, "/my-root", QOSGuaranteed, "my_root.slice/my_root-kubepods.slice"},
		{DriverSystemd, "/", KubeQOS(0), ""},
		{DriverCgroupfs, "/", KubeQOS(7), ""},
		{Driver("bogus"), "/", QOSBurstable, ""},
		{DriverSystemd, "/a b", QOSGuaranteed, ""},
		{DriverCgroupfs, "/a/../b", QOSGuaranteed, ""},
	} {
		if got := (Naming{Driver: tc.d, Root: tc.root}).QOSPath(tc.q); got != tc.want {
			t.Errorf("Naming{%s, %q}.QOSPath(%v) = %q, want %q", tc.d, tc.root, tc.q, got, tc.want)
		}
	}
}

func TestPodPathGolden(t *testing.T) {
	t.Parallel()
	const uid = "8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"
	const staticUID = "0f2c6d5c9e3a4b1f8a7d6e5c4b3a2910" // static pods: config hash
	for _, tc := range []struct {
		d    Driver
		root string
		q    KubeQOS
		uid  string
		want string
	}{
		{DriverCgroupfs, "/", QOSGuaranteed, uid, "kubepods/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverCgroupfs, "/", QOSBurstable, uid, "kubepods/burstable/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverCgroupfs, "/", QOSBestEffort, uid, "kubepods/besteffort/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverSystemd, "/", QOSGuaranteed, uid, "kubepods.slice/kubepods-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, "/", QOSBurstable, uid, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, "/", QOSBestEffort, uid, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverCgroupfs, "/", QOSBurstable, staticUID, "kubepods/burstable/pod0f2c6d5c9e3a4b1f8a7d6e5c4b3a2910"},
		{DriverSystemd, "/", QOSBurstable, staticUID, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f2c6d5c9e3a4b1f8a7d6e5c4b3a2910.slice"},
		// Below a --cgroup-root.
		{DriverCgroupfs, "/kubelet", QOSBestEffort, uid, "kubelet/kubepods/besteffort/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverCgroupfs, "/a/b", QOSGuaranteed, uid, "a/b/kubepods/pod8dbc9e11-dc93-4eb2-bbef-ed21cf1db420"},
		{DriverSystemd, "/kubelet", QOSGuaranteed, uid, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, "/kubelet", QOSBurstable, uid, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/" +
			"kubelet-kubepods-burstable-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, "/kubelet", QOSBestEffort, uid, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/" +
			"kubelet-kubepods-besteffort-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, "/a/b", QOSGuaranteed, uid, "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
		{DriverSystemd, "/a/b", QOSBestEffort, uid, "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/" +
			"a-b-kubepods-besteffort-pod8dbc9e11_dc93_4eb2_bbef_ed21cf1db420.slice"},
	} {
		n := Naming{Driver: tc.d, Root: tc.root}
		got, err := n.PodPath(tc.q, tc.uid)
		if err != nil || got != tc.want {
			t.Errorf("Naming{%s, %q}.PodPath(%v, %q) = %q, %v; want %q", tc.d, tc.root, tc.q, tc.uid, got, err, tc.want)
		}
		if _, err := CleanPath(got); err != nil {
			t.Errorf("PodPath result %q is not a clean path: %v", got, err)
		}
		// The pod cgroup sits in its QoS cgroup.
		if parent := n.QOSPath(tc.q); path.Dir(got) != parent {
			t.Errorf("PodPath result %q is not a child of %q", got, parent)
		}
	}
}

func TestPodPathRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		d    Driver
		root string
		q    KubeQOS
		uid  string
		err  error
	}{
		{"empty", DriverCgroupfs, "/", QOSBurstable, "", ErrInvalidPath},
		{"parent escape", DriverCgroupfs, "/", QOSBurstable, "../../x", ErrInvalidPath},
		{"dotdot", DriverSystemd, "/", QOSBurstable, "..", ErrInvalidPath},
		{"dot", DriverCgroupfs, "/", QOSBurstable, ".", ErrInvalidPath},
		{"embedded dotdot", DriverCgroupfs, "/", QOSBestEffort, "a..b", ErrInvalidPath},
		{"slash", DriverCgroupfs, "/", QOSBurstable, "a/b", ErrInvalidPath},
		{"leading slash", DriverSystemd, "/", QOSBurstable, "/etc", ErrInvalidPath},
		{"NUL", DriverCgroupfs, "/", QOSBurstable, "a\x00b", ErrInvalidPath},
		{"space", DriverCgroupfs, "/", QOSBurstable, "a b", ErrInvalidPath},
		{"tab", DriverCgroupfs, "/", QOSBurstable, "a\tb", ErrInvalidPath},
		{"newline", DriverSystemd, "/", QOSBurstable, "a\nb", ErrInvalidPath},
		{"non-ascii", DriverCgroupfs, "/", QOSBurstable, "pödé", ErrInvalidPath},
		{"backslash", DriverCgroupfs, "/", QOSBurstable, `a\b`, ErrInvalidPath},
		{"hidden", DriverCgroupfs, "/", QOSBurstable, ".hidden", ErrInvalidPath},
		{"too long", DriverCgroupfs, "/", QOSBurstable, strings.Repeat("a", MaxNameLen+1), ErrInvalidPath},
		{"bad qos", DriverCgroupfs, "/", KubeQOS(0), "abc", ErrInvalidValue},
		{"bad driver", Driver("x"), "/", QOSBurstable, "abc", ErrInvalidDriver},
		{"root escapes", DriverCgroupfs, "/a/../../b", QOSBurstable, "abc", ErrInvalidPath},
		{"root no slice name", DriverSystemd, "/a b", QOSBurstable, "abc", ErrInvalidPath},
		// The root's chain makes the pod's slice name longer than NAME_MAX.
		{"systemd name too long", DriverSystemd, "/" + strings.Repeat("r", 100) + "/" + strings.Repeat("s", 100),
			QOSBestEffort, strings.Repeat("u", 30), ErrInvalidPath},
	} {
		got, err := Naming{Driver: tc.d, Root: tc.root}.PodPath(tc.q, tc.uid)
		if !errors.Is(err, tc.err) || got != "" {
			t.Errorf("%s: PodPath(%s, %v, %q) = %q, %v; want error %v", tc.name, tc.d, tc.q, tc.uid, got, err, tc.err)
		}
	}
	// The longest accepted UID still yields a valid path.
	long := strings.Repeat("a", MaxNameLen)
	p, err := Naming{Driver: DriverSystemd}.PodPath(QOSBestEffort, long)
	if err != nil {
		t.Fatalf("PodPath(max len): %v", err)
	}
	if _, err := CleanPath(p); err != nil {
		t.Fatalf("CleanPath(%q): %v", p, err)
	}
}

func TestTierName(t *testing.T) {
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
		got, err := Naming{Driver: tc.d}.TierPathIn(QOSBestEffort, tc.name)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("TierPathIn(%s, BestEffort, %q) = %q, %v; want %q, %v", tc.d, tc.name, got, err, tc.want, tc.err)
		}
	}
}

func TestTierPathIn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    Driver
		root string
		q    KubeQOS
		want string
		err  error
	}{
		{DriverCgroupfs, "/", QOSGuaranteed, "kubepods/understory-batch", nil},
		{DriverSystemd, "/", QOSGuaranteed, "kubepods.slice/kubepods-understory_batch.slice", nil},
		{DriverCgroupfs, "/", QOSBestEffort, "kubepods/besteffort/understory-batch", nil},
		{DriverSystemd, "/", QOSBurstable, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-understory_batch.slice", nil},
		{DriverCgroupfs, "/", KubeQOS(0), "", ErrInvalidValue},
		// Below a --cgroup-root: the tier is a child component of kubelet's name of the
		// QoS cgroup, so under systemd its slice carries the root's chain.
		{DriverCgroupfs, "/kubelet", QOSGuaranteed, "kubelet/kubepods/understory-batch", nil},
		{DriverCgroupfs, "/kubelet", QOSBestEffort, "kubelet/kubepods/besteffort/understory-batch", nil},
		{DriverSystemd, "/kubelet", QOSGuaranteed, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-understory_batch.slice", nil},
		{DriverSystemd, "/kubelet", QOSBestEffort, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/" +
			"kubelet-kubepods-besteffort-understory_batch.slice", nil},
		{DriverSystemd, "/a/b", QOSGuaranteed, "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-understory_batch.slice", nil},
		{DriverSystemd, "/a/b", QOSBestEffort, "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/" +
			"a-b-kubepods-besteffort-understory_batch.slice", nil},
		{DriverSystemd, "/a:b", QOSGuaranteed, "", ErrInvalidPath},
		{Driver("x"), "/", QOSGuaranteed, "", ErrInvalidDriver},
	} {
		got, err := Naming{Driver: tc.d, Root: tc.root}.TierPathIn(tc.q, DefaultTierName)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("Naming{%s, %q}.TierPathIn(%v) = %q, %v; want %q, %v", tc.d, tc.root, tc.q, got, err, tc.want, tc.err)
		}
	}
}

// kubelet's --cgroup-root as kubelet takes it: its own cgroup's path under each
// driver, and the roots that cannot be named.
func TestNamingRoot(t *testing.T) {
	t.Parallel()
	long := func(c byte, n int) string { return strings.Repeat(string(c), n) }
	for _, tc := range []struct {
		d    Driver
		root string
		want string
		err  error
	}{
		{DriverCgroupfs, "/", "", nil},
		{DriverCgroupfs, "", "", nil},
		{DriverSystemd, "/", "", nil},
		{DriverCgroupfs, "/kubelet", "kubelet", nil},
		{DriverCgroupfs, "kubelet/", "kubelet", nil},
		{DriverCgroupfs, "/a/b", "a/b", nil},
		{DriverSystemd, "/kubelet", "kubelet.slice", nil},
		{DriverSystemd, "/kubelet/", "kubelet.slice", nil},
		{DriverSystemd, "/a/b", "a.slice/a-b.slice", nil},
		{DriverSystemd, "/a/b/c", "a.slice/a-b.slice/a-b-c.slice", nil},
		{DriverSystemd, "/my-root/x", "my_root.slice/my_root-x.slice", nil},
		// kubelet takes a slice name as one more component.
		{DriverSystemd, "/kubelet.slice", "kubelet.slice.slice", nil},
		// Names a cgroupfs path may have but a slice unit may not.
		{DriverCgroupfs, "/a b", "a b", nil},
		{DriverSystemd, "/a b", "", ErrInvalidPath},
		{DriverCgroupfs, "/a:b", "a:b", nil},
		{DriverSystemd, "/a:b", "", ErrInvalidPath},
		{DriverCgroupfs, "/.hidden", ".hidden", nil},
		{DriverSystemd, "/.hidden", "", ErrInvalidPath},
		{DriverSystemd, "/a/.b", "", ErrInvalidPath},
		{DriverSystemd, "/" + long('a', MaxNameLen+1), "", ErrInvalidPath},
		{DriverSystemd, "/" + long('a', 100) + "/" + long('b', 100) + "/" + long('c', 100), "", ErrInvalidPath},
		{DriverCgroupfs, "/" + long('a', 100) + "/" + long('b', 100) + "/" + long('c', 100),
			long('a', 100) + "/" + long('b', 100) + "/" + long('c', 100), nil},
		// Never outside the hierarchy.
		{DriverCgroupfs, "/a/../../b", "", ErrInvalidPath},
		{DriverSystemd, "/a/../b", "", ErrInvalidPath},
		{DriverCgroupfs, "/a//b", "", ErrInvalidPath},
		{DriverCgroupfs, "/a/./b", "", ErrInvalidPath},
		{DriverCgroupfs, "/a\x00", "", ErrInvalidPath},
		{DriverCgroupfs, "/a\nb", "", ErrInvalidPath},
		{Driver(""), "/", "", ErrInvalidDriver},
	} {
		n := Naming{Driver: tc.d, Root: tc.root}
		got, err := n.RootPath()
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("Naming{%s, %q}.RootPath() = %q, %v; want %q, %v", tc.d, tc.root, got, err, tc.want, tc.err)
		}
		if verr := n.Validate(); !errors.Is(verr, tc.err) {
			t.Errorf("Naming{%s, %q}.Validate() = %v; want %v", tc.d, tc.root, verr, tc.err)
		}
		if tc.err == nil {
			// kubepods sits in the root.
			if qos := n.QOSPath(QOSGuaranteed); path.Join(got, path.Base(qos)) != qos {
				t.Errorf("Naming{%s, %q}: kubepods %q is not a child of the root %q", tc.d, tc.root, qos, got)
			}
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
	const esc = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0"
	tests := []struct {
		name   string
		d      Driver
		root   string
		q      KubeQOS
		dir    string
		want   string
		wantOK bool
	}{
		{"cgroupfs burstable", DriverCgroupfs, "/", QOSBurstable, "pod" + uid, uid, true},
		{"cgroupfs guaranteed", DriverCgroupfs, "/", QOSGuaranteed, "pod" + uid, uid, true},
		{"systemd besteffort", DriverSystemd, "/", QOSBestEffort, "kubepods-besteffort-pod" + esc + ".slice", uid, true},
		{"systemd guaranteed", DriverSystemd, "/", QOSGuaranteed, "kubepods-pod" + esc + ".slice", uid, true},
		{"systemd wrong qos prefix", DriverSystemd, "/", QOSBurstable, "kubepods-besteffort-pod" + uid + ".slice", "", false},
		{"tier is no pod", DriverCgroupfs, "/", QOSGuaranteed, "understory-batch", "", false},
		{"qos dir is no pod", DriverCgroupfs, "/", QOSGuaranteed, "burstable", "", false},
		{"empty uid", DriverCgroupfs, "/", QOSBurstable, "pod", "", false},
		{"unsafe uid", DriverCgroupfs, "/", QOSBurstable, "pod..", "", false},
		{"systemd missing suffix", DriverSystemd, "/", QOSBestEffort, "kubepods-besteffort-pod" + uid, "", false},
		{"bad driver", Driver("x"), "/", QOSBurstable, "pod" + uid, "", false},
		// Below kind's --cgroup-root /kubelet.
		{"cgroupfs root", DriverCgroupfs, "/kubelet", QOSBestEffort, "pod" + uid, uid, true},
		{"systemd root besteffort", DriverSystemd, "/kubelet", QOSBestEffort, "kubelet-kubepods-besteffort-pod" + esc + ".slice", uid, true},
		{"systemd root guaranteed", DriverSystemd, "/a/b", QOSGuaranteed, "a-b-kubepods-pod" + esc + ".slice", uid, true},
		{"systemd root tier is no pod", DriverSystemd, "/kubelet", QOSGuaranteed, "kubelet-kubepods-understory_batch.slice", "", false},
		{"systemd root qos slice is no pod", DriverSystemd, "/kubelet", QOSGuaranteed, "kubelet-kubepods-besteffort.slice", "", false},
		{"systemd root missing from the name", DriverSystemd, "/kubelet", QOSBestEffort, "kubepods-besteffort-pod" + esc + ".slice", "", false},
		{"systemd name of another root", DriverSystemd, "/", QOSBestEffort, "kubelet-kubepods-besteffort-pod" + esc + ".slice", "", false},
		{"invalid root", DriverSystemd, "/a b", QOSBestEffort, "a b-kubepods-besteffort-pod" + esc + ".slice", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := Naming{Driver: tt.d, Root: tt.root}
			got, ok := n.PodUIDFromDir(tt.q, tt.dir)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("PodUIDFromDir(%q) = %q, %v; want %q, %v", tt.dir, got, ok, tt.want, tt.wantOK)
			}
			if ok {
				p, err := n.PodPath(tt.q, got)
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
				got, err := Naming{Driver: d}.TierPathIn(q, name)
				if !errors.Is(err, ErrInvalidPath) {
					t.Errorf("TierPathIn(%s, %v, %q) = %q, %v; want ErrInvalidPath", d, q, name, got, err)
				}
			}
		}
	}
}
