package cgroups

import (
	"errors"
	"path"
	"strings"
	"testing"
)

const (
	knUID = "0b5e6f1c-1111-4222-8333-444455556666"
	knEsc = "0b5e6f1c_1111_4222_8333_444455556666"
	knCtr = "3f1e2d4c5b6a79881726354453627180a9b8c7d6e5f4031221304f5e6d7c8b9a"
	// knStatic is a static pod's UID: kubelet's hash of the manifest.
	knStatic = "6e5a8c2e5e1d3d6e0f9a8b7c6d5e4f3a"
)

func TestParseCgroupPath(t *testing.T) {
	t.Parallel()
	pod := func(d Driver, q KubeQOS, tier, ctr string) PodCgroup {
		return PodCgroup{Driver: d, QOS: q, Tier: tier, UID: knUID, ContainerID: ctr}
	}
	const fs, sd = DriverCgroupfs, DriverSystemd
	for _, tc := range []struct {
		name string
		in   string
		want PodCgroup
		err  error
	}{
		// kubelet's own pod cgroups.
		{"cgroupfs guaranteed", "/kubepods/pod" + knUID + "/" + knCtr, pod(fs, QOSGuaranteed, "", knCtr), nil},
		{"cgroupfs burstable", "/kubepods/burstable/pod" + knUID + "/" + knCtr, pod(fs, QOSBurstable, "", knCtr), nil},
		{"cgroupfs besteffort", "/kubepods/besteffort/pod" + knUID + "/" + knCtr, pod(fs, QOSBestEffort, "", knCtr), nil},
		{"cgroupfs cri-o", "/kubepods/besteffort/pod" + knUID + "/crio-" + knCtr, pod(fs, QOSBestEffort, "", knCtr), nil},
		{"cgroupfs pod itself", "/kubepods/burstable/pod" + knUID, pod(fs, QOSBurstable, "", ""), nil},
		{"cgroupfs below the container", "/kubepods/pod" + knUID + "/" + knCtr + "/init", pod(fs, QOSGuaranteed, "", knCtr), nil},
		{"cgroupfs no container name", "/kubepods/pod" + knUID + "/init", pod(fs, QOSGuaranteed, "", ""), nil},
		{"cgroupfs static pod", "/kubepods/burstable/pod" + knStatic,
			PodCgroup{Driver: fs, QOS: QOSBurstable, UID: knStatic}, nil},
		{"cgroupfs kubelet root", "/node1/kubepods/besteffort/pod" + knUID, pod(fs, QOSBestEffort, "", ""), nil},
		{"systemd guaranteed docker", "/kubepods.slice/kubepods-pod" + knEsc + ".slice/docker-" + knCtr + ".scope",
			pod(sd, QOSGuaranteed, "", knCtr), nil},
		{"systemd burstable containerd", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + knEsc +
			".slice/cri-containerd-" + knCtr + ".scope", pod(sd, QOSBurstable, "", knCtr), nil},
		{"systemd besteffort crio", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + knEsc +
			".slice/crio-" + knCtr + ".scope", pod(sd, QOSBestEffort, "", knCtr), nil},
		{"systemd conmon is no container", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + knEsc +
			".slice/crio-conmon-" + knCtr + ".scope", pod(sd, QOSBestEffort, "", ""), nil},
		{"systemd container without scope", "/kubepods.slice/kubepods-pod" + knEsc + ".slice/cri-containerd-" + knCtr,
			pod(sd, QOSGuaranteed, "", ""), nil},
		{"systemd kubelet root (kind)", "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/" +
			"kubelet-kubepods-besteffort-pod" + knEsc + ".slice/cri-containerd-" + knCtr + ".scope",
			pod(sd, QOSBestEffort, "", knCtr), nil},
		{"systemd kubelet root two levels", "/a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-pod" + knEsc + ".slice",
			pod(sd, QOSGuaranteed, "", ""), nil},
		{"systemd kubelet root with dash", "/my_root.slice/my_root-kubepods.slice/my_root-kubepods-burstable.slice/" +
			"my_root-kubepods-burstable-pod" + knEsc + ".slice/crio-" + knCtr + ".scope", pod(sd, QOSBurstable, "", knCtr), nil},
		{"cgroupfs kubelet root two levels", "/a/b/kubepods/pod" + knUID + "/" + knCtr, pod(fs, QOSGuaranteed, "", knCtr), nil},
		// The agent's tier, both parents, both drivers.
		{"tier cgroupfs in kubepods", "/kubepods/understory-batch/pod" + knUID + "/" + knCtr,
			pod(fs, QOSGuaranteed, "understory-batch", knCtr), nil},
		{"tier cgroupfs in besteffort", "/kubepods/besteffort/understory-batch/pod" + knUID,
			pod(fs, QOSBestEffort, "understory-batch", ""), nil},
		{"tier systemd in kubepods", "/kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod" +
			knEsc + ".slice/cri-containerd-" + knCtr + ".scope", pod(sd, QOSGuaranteed, "understory-batch", knCtr), nil},
		{"tier systemd in besteffort", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-understory_batch.slice/" +
			"kubepods-besteffort-understory_batch-pod" + knEsc + ".slice", pod(sd, QOSBestEffort, "understory-batch", ""), nil},
		{"tier systemd below kind's root", "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-understory_batch.slice/" +
			"kubelet-kubepods-understory_batch-pod" + knEsc + ".slice/cri-containerd-" + knCtr + ".scope",
			pod(sd, QOSGuaranteed, "understory-batch", knCtr), nil},
		{"tier systemd in besteffort below a root", "/a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/" +
			"a-b-kubepods-besteffort-understory_batch.slice/a-b-kubepods-besteffort-understory_batch-pod" + knEsc + ".slice",
			pod(sd, QOSBestEffort, "understory-batch", ""), nil},
		{"tier cgroupfs below a root", "/kubelet/kubepods/understory-batch/pod" + knUID + "/" + knCtr,
			pod(fs, QOSGuaranteed, "understory-batch", knCtr), nil},
		// A slice named on the root's chain that sits in a slice of another chain is
		// not what kubelet (or runc, expanding the unit) makes.
		{"systemd root chain in the wrong parent", "/kubelet.slice/kubelet-kubepods.slice/kubepods-besteffort.slice/" +
			"kubelet-kubepods-besteffort-pod" + knEsc + ".slice", PodCgroup{}, ErrNotPodCgroup},
		// Another cgroup namespace hides the ancestors.
		{"hidden cgroupfs qos", "/../../../besteffort/pod" + knUID + "/" + knCtr, pod(fs, QOSBestEffort, "", knCtr), nil},
		{"hidden cgroupfs everything", "/../pod" + knUID, pod(fs, 0, "", ""), nil},
		{"hidden cgroupfs tier", "/../understory-batch/pod" + knUID, pod(fs, 0, "understory-batch", ""), nil},
		{"hidden systemd", "/../kubepods-besteffort-pod" + knEsc + ".slice/cri-containerd-" + knCtr + ".scope",
			pod(sd, QOSBestEffort, "", knCtr), nil},
		// Nested: the outermost pod is this node's.
		{"pod inside a pod", "/kubepods/burstable/pod" + knUID + "/" + knCtr + "/kubelet.slice/kubelet-kubepods.slice/" +
			"kubelet-kubepods-pod1111.slice/cri-containerd-abc.scope", pod(fs, QOSBurstable, "", knCtr), nil},
		// Hostile or foreign names.
		{"uid with dotdot", "/kubepods/pod..", PodCgroup{}, ErrNotPodCgroup},
		{"uid with a dot", "/kubepods/pod" + knUID + ".x", PodCgroup{}, ErrNotPodCgroup},
		{"uid with underscore (cgroupfs)", "/kubepods/pod" + knEsc, PodCgroup{}, ErrNotPodCgroup},
		{"uid with dash (systemd)", "/kubepods.slice/kubepods-pod" + knUID + ".slice", PodCgroup{}, ErrNotPodCgroup},
		{"uid too long", "/kubepods/pod" + strings.Repeat("a", MaxNameLen+1), PodCgroup{}, ErrNotPodCgroup},
		{"empty uid", "/kubepods/pod", PodCgroup{}, ErrNotPodCgroup},
		{"systemd empty uid", "/kubepods.slice/kubepods-pod.slice", PodCgroup{}, ErrNotPodCgroup},
		{"pod outside kubepods", "/machine/pod" + knUID, PodCgroup{}, ErrNotPodCgroup},
		{"qos name outside kubepods", "/machine/besteffort/pod" + knUID, PodCgroup{}, ErrNotPodCgroup},
		{"unknown depth below kubepods", "/kubepods/a/b/pod" + knUID, PodCgroup{}, ErrNotPodCgroup},
		{"tier with pod in its name", "/kubepods/mypods/pod" + knUID, PodCgroup{}, ErrNotPodCgroup},
		{"tier with underscore", "/kubepods/under_score/pod" + knUID, PodCgroup{}, ErrNotPodCgroup},
		{"systemd foreign chain", "/kubepods.slice/kubepods-a-b.slice/kubepods-a-b-pod" + knEsc + ".slice",
			PodCgroup{}, ErrNotPodCgroup},
		{"systemd slice in a foreign parent", "/kubepods.slice/other.slice/kubepods-besteffort-pod" + knEsc + ".slice",
			PodCgroup{}, ErrNotPodCgroup},
		{"systemd without kubepods", "/machine.slice/machine-pod" + knEsc + ".slice", PodCgroup{}, ErrNotPodCgroup},
		{"systemd root slice alone", "/kubepods-pod" + knEsc + ".slice", PodCgroup{}, ErrNotPodCgroup},
		{"qos cgroup", "/kubepods/besteffort", PodCgroup{}, ErrNotPodCgroup},
		{"root", "/", PodCgroup{}, ErrNotPodCgroup},
		{"relative", "kubepods/pod" + knUID, PodCgroup{}, ErrInvalidPath},
		{"dotdot inside", "/kubepods/../pod" + knUID, PodCgroup{}, ErrInvalidPath},
		{"dot inside", "/kubepods/./pod" + knUID, PodCgroup{}, ErrInvalidPath},
		{"control byte", "/kubepods/pod" + knUID + "\n", PodCgroup{}, ErrInvalidPath},
		{"too long", "/" + strings.Repeat("a/", 2100), PodCgroup{}, ErrInvalidPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseCgroupPath(tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || got != (PodCgroup{}) {
					t.Fatalf("ParseCgroupPath(%q) = %+v, %v; want error %v", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseCgroupPath(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

// Every pod cgroup this package builds, kubelet's and the tier's, under both drivers,
// parses back to what built it, and so does a container's cgroup below it.
func TestParseCgroupPathRoundTrip(t *testing.T) {
	t.Parallel()
	for _, n := range []Naming{
		{Driver: DriverCgroupfs}, {Driver: DriverSystemd},
		{Driver: DriverCgroupfs, Root: "/kubelet"}, {Driver: DriverSystemd, Root: "/kubelet"},
		{Driver: DriverCgroupfs, Root: "/a/b"}, {Driver: DriverSystemd, Root: "/a/b"},
		{Driver: DriverSystemd, Root: "/my-root"}, {Driver: DriverSystemd, Root: "/besteffort"},
	} {
		d := n.Driver
		for _, q := range []KubeQOS{QOSGuaranteed, QOSBurstable, QOSBestEffort} {
			for _, tier := range []string{"", DefaultTierName, "batch.v2"} {
				for _, uid := range []string{knUID, knStatic, "u1"} {
					var pod string
					var err error
					if tier == "" {
						pod, err = n.PodPath(q, uid)
					} else {
						var tp string
						if tp, err = n.TierPathIn(q, tier); err == nil {
							pod, err = TierPodPath(d, tp, uid)
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					ctr := knCtr
					if d == DriverSystemd {
						ctr = "cri-containerd-" + knCtr + ".scope"
					}
					want := PodCgroup{Driver: d, QOS: q, Tier: tier, UID: uid}
					if got, err := ParseCgroupPath("/" + pod); err != nil || got != want {
						t.Errorf("ParseCgroupPath(/%s) = %+v, %v; want %+v", pod, got, err, want)
					}
					want.ContainerID = knCtr
					if got, err := ParseCgroupPath("/" + pod + "/" + ctr); err != nil || got != want {
						t.Errorf("ParseCgroupPath(/%s/%s) = %+v, %v; want %+v", pod, ctr, got, err, want)
					}
				}
			}
		}
	}
}

func TestParsePodCgroupParent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		parent string
		want   PodCgroup
		err    error
	}{
		{"cgroupfs", "/kubepods/burstable/pod" + knUID, PodCgroup{Driver: DriverCgroupfs, QOS: QOSBurstable, UID: knUID}, nil},
		{"cgroupfs guaranteed", "/kubepods/pod" + knUID, PodCgroup{Driver: DriverCgroupfs, QOS: QOSGuaranteed, UID: knUID}, nil},
		{"cgroupfs root", "/besteffort/kubepods/pod" + knUID, PodCgroup{Driver: DriverCgroupfs, QOS: QOSGuaranteed, UID: knUID}, nil},
		{"systemd", "kubepods-besteffort-pod" + knEsc + ".slice", PodCgroup{Driver: DriverSystemd, QOS: QOSBestEffort, UID: knUID}, nil},
		{"systemd root", "burstable-kubepods-pod" + knEsc + ".slice", PodCgroup{Driver: DriverSystemd, QOS: QOSGuaranteed, UID: knUID}, nil},
		{"systemd uid spelling besteffort", "kubepods-burstable-podbesteffort_1.slice",
			PodCgroup{Driver: DriverSystemd, QOS: QOSBurstable, UID: "besteffort-1"}, nil},
		{"cgroupfs uid spelling burstable", "/kubepods/podburstable-1",
			PodCgroup{Driver: DriverCgroupfs, QOS: QOSGuaranteed, UID: "burstable-1"}, nil},
		{"cgroupfs kind root", "/kubelet/kubepods/besteffort/pod" + knUID, PodCgroup{Driver: DriverCgroupfs, QOS: QOSBestEffort, UID: knUID}, nil},
		{"systemd kind root", "kubelet-kubepods-besteffort-pod" + knEsc + ".slice", PodCgroup{Driver: DriverSystemd, QOS: QOSBestEffort, UID: knUID}, nil},
		{"systemd two-level root", "a-b-kubepods-burstable-pod" + knEsc + ".slice", PodCgroup{Driver: DriverSystemd, QOS: QOSBurstable, UID: knUID}, nil},
		{"systemd tier below kind root", "kubelet-kubepods-understory_batch-pod" + knEsc + ".slice",
			PodCgroup{Driver: DriverSystemd, QOS: QOSGuaranteed, Tier: DefaultTierName, UID: knUID}, nil},
		{"empty", "", PodCgroup{}, ErrInvalidPath},
		{"cgroupfs not the last component", "/kubepods/pod" + knUID + "/" + knCtr, PodCgroup{}, ErrNotPodCgroup},
		{"cgroupfs qos cgroup", "/kubepods/besteffort", PodCgroup{}, ErrNotPodCgroup},
		{"cgroupfs hidden", "/../besteffort/pod" + knUID, PodCgroup{}, ErrNotPodCgroup},
		{"cgroupfs dotdot uid", "/kubepods/besteffort/pod..", PodCgroup{}, ErrNotPodCgroup},
		{"systemd path", "kubepods.slice/kubepods-pod" + knEsc + ".slice", PodCgroup{}, ErrInvalidPath},
		{"systemd qos slice", "kubepods-besteffort.slice", PodCgroup{}, ErrNotPodCgroup},
		{"systemd empty part", "kubepods--pod" + knEsc + ".slice", PodCgroup{}, ErrInvalidPath},
		{"systemd scope", "kubepods-pod" + knEsc + ".scope", PodCgroup{}, ErrInvalidPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParsePodCgroupParent(tc.parent)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || got != (PodCgroup{}) {
					t.Fatalf("ParsePodCgroupParent(%q) = %+v, %v; want error %v", tc.parent, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParsePodCgroupParent(%q) = %+v, %v; want %+v", tc.parent, got, err, tc.want)
			}
		})
	}
}

func TestTierPodPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		d    Driver
		tier string
		uid  string
		want string
		err  error
	}{
		{"cgroupfs", DriverCgroupfs, "kubepods/understory-batch", knUID, "kubepods/understory-batch/pod" + knUID, nil},
		{"cgroupfs kubelet root", DriverCgroupfs, "node1/kubepods/besteffort/understory-batch", knUID,
			"node1/kubepods/besteffort/understory-batch/pod" + knUID, nil},
		{"systemd", DriverSystemd, "kubepods.slice/kubepods-understory_batch.slice", knUID,
			"kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod" + knEsc + ".slice", nil},
		{"systemd besteffort", DriverSystemd, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-understory_batch.slice", knUID,
			"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-understory_batch.slice/" +
				"kubepods-besteffort-understory_batch-pod" + knEsc + ".slice", nil},
		{"systemd kind root", DriverSystemd, "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-understory_batch.slice", knUID,
			"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-understory_batch.slice/kubelet-kubepods-understory_batch-pod" + knEsc + ".slice", nil},
		{"systemd two-level root besteffort", DriverSystemd,
			"a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/a-b-kubepods-besteffort-understory_batch.slice", knUID,
			"a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/a-b-kubepods-besteffort-understory_batch.slice/" +
				"a-b-kubepods-besteffort-understory_batch-pod" + knEsc + ".slice", nil},
		{"systemd unit too long", DriverSystemd, strings.Repeat("t", 200) + ".slice", strings.Repeat("u", 60), "", ErrInvalidPath},
		{"escaping uid", DriverCgroupfs, "kubepods/understory-batch", "../../etc", "", ErrInvalidPath},
		{"uid with slash", DriverSystemd, "kubepods.slice/kubepods-understory_batch.slice", "a/b", "", ErrInvalidPath},
		{"dotdot uid", DriverSystemd, "kubepods.slice/kubepods-understory_batch.slice", "..", "", ErrInvalidPath},
		{"unclean tier", DriverCgroupfs, "kubepods/../x", knUID, "", ErrInvalidPath},
		{"systemd tier no slice", DriverSystemd, "kubepods/understory-batch", knUID, "", ErrInvalidPath},
		{"bad driver", Driver("x"), "kubepods/understory-batch", knUID, "", ErrInvalidDriver},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := TierPodPath(tc.d, tc.tier, tc.uid)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("TierPodPath(%s, %q, %q) = %q, %v; want %q, %v", tc.d, tc.tier, tc.uid, got, err, tc.want, tc.err)
			}
		})
	}
}

// The unit names systemd knows the tier and a batch pod below it by, and the paths
// systemd gives those units back.
func TestSliceUnit(t *testing.T) {
	t.Parallel()
	must := func(p string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	sd := Naming{Driver: DriverSystemd}
	kind := Naming{Driver: DriverSystemd, Root: "/kubelet"}
	ab := Naming{Driver: DriverSystemd, Root: "/a/b"}
	tier := must(sd.TierPathIn(QOSBestEffort, DefaultTierName))
	kindTier := must(kind.TierPathIn(QOSGuaranteed, DefaultTierName))
	kindBETier := must(kind.TierPathIn(QOSBestEffort, DefaultTierName))
	abTier := must(ab.TierPathIn(QOSGuaranteed, DefaultTierName))
	for _, tc := range []struct {
		rel, unit string
	}{
		{tier, "kubepods-besteffort-understory_batch.slice"},
		{must(TierPodPath(DriverSystemd, tier, knUID)), "kubepods-besteffort-understory_batch-pod" + knEsc + ".slice"},
		{sd.QOSPath(QOSGuaranteed), "kubepods.slice"},
		// Below a --cgroup-root every unit carries the root's chain.
		{must(kind.RootPath()), "kubelet.slice"},
		{kind.QOSPath(QOSGuaranteed), "kubelet-kubepods.slice"},
		{kind.QOSPath(QOSBestEffort), "kubelet-kubepods-besteffort.slice"},
		{must(kind.PodPath(QOSBurstable, knUID)), "kubelet-kubepods-burstable-pod" + knEsc + ".slice"},
		{kindTier, "kubelet-kubepods-understory_batch.slice"},
		{must(TierPodPath(DriverSystemd, kindTier, knUID)), "kubelet-kubepods-understory_batch-pod" + knEsc + ".slice"},
		{kindBETier, "kubelet-kubepods-besteffort-understory_batch.slice"},
		{must(TierPodPath(DriverSystemd, kindBETier, knUID)), "kubelet-kubepods-besteffort-understory_batch-pod" + knEsc + ".slice"},
		{must(ab.RootPath()), "a-b.slice"},
		{ab.QOSPath(QOSBurstable), "a-b-kubepods-burstable.slice"},
		{must(ab.PodPath(QOSGuaranteed, knUID)), "a-b-kubepods-pod" + knEsc + ".slice"},
		{abTier, "a-b-kubepods-understory_batch.slice"},
		{must(TierPodPath(DriverSystemd, abTier, knUID)), "a-b-kubepods-understory_batch-pod" + knEsc + ".slice"},
	} {
		unit, err := SliceUnit(tc.rel)
		if err != nil || unit != tc.unit {
			t.Errorf("SliceUnit(%q) = %q, %v; want %q", tc.rel, unit, err, tc.unit)
		}
		// systemd's path of the unit is the path it was named from.
		if p, err := SlicePath(unit); err != nil || p != tc.rel {
			t.Errorf("SlicePath(%q) = %q, %v; want %q", unit, p, err, tc.rel)
		}
	}
	if p, err := SlicePath("-.slice"); err != nil || p != "" {
		t.Errorf("SlicePath(root slice) = %q, %v", p, err)
	}
	for _, bad := range []string{"", ".slice", "a--b.slice", "-a.slice", "a-.slice", "a.scope", "../a.slice",
		"a b.slice", "/a.slice", "kubepods/understory-batch", strings.Repeat("a", 256) + ".slice"} {
		if u, err := SliceUnit(bad); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("SliceUnit(%q) = %q, %v; want ErrInvalidPath", bad, u, err)
		}
	}
}

func TestContainerCgroupsPath(t *testing.T) {
	t.Parallel()
	const id = "abc123"
	for _, tc := range []struct {
		name   string
		d      Driver
		pod    string
		prefix string
		want   string
	}{
		{"cgroupfs", DriverCgroupfs, "kubepods/besteffort/pod" + knUID, "", "/kubepods/besteffort/pod" + knUID + "/" + id},
		{"cgroupfs tier", DriverCgroupfs, "kubepods/understory-batch/pod" + knUID, "", "/kubepods/understory-batch/pod" + knUID + "/" + id},
		{"systemd containerd", DriverSystemd, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + knEsc + ".slice",
			"cri-containerd", "kubepods-besteffort-pod" + knEsc + ".slice:cri-containerd:" + id},
		{"systemd crio tier", DriverSystemd, "kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod" + knEsc + ".slice",
			"crio", "kubepods-understory_batch-pod" + knEsc + ".slice:crio:" + id},
		{"cgroupfs tier below kind root", DriverCgroupfs, "kubelet/kubepods/understory-batch/pod" + knUID, "",
			"/kubelet/kubepods/understory-batch/pod" + knUID + "/" + id},
		{"systemd tier below kind root", DriverSystemd,
			"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-understory_batch.slice/kubelet-kubepods-understory_batch-pod" + knEsc + ".slice",
			"cri-containerd", "kubelet-kubepods-understory_batch-pod" + knEsc + ".slice:cri-containerd:" + id},
		{"systemd besteffort tier below a two-level root", DriverSystemd,
			"a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/a-b-kubepods-besteffort-understory_batch.slice/" +
				"a-b-kubepods-besteffort-understory_batch-pod" + knEsc + ".slice",
			"cri-containerd", "a-b-kubepods-besteffort-understory_batch-pod" + knEsc + ".slice:cri-containerd:" + id},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ContainerCgroupsPath(tc.d, tc.pod, tc.prefix, id)
			if err != nil || got != tc.want {
				t.Fatalf("ContainerCgroupsPath = %q, %v; want %q", got, err, tc.want)
			}
			rc, err := ParseContainerCgroupsPath(tc.d, got)
			wantParent := tc.pod
			if tc.d == DriverSystemd {
				wantParent = path.Base(tc.pod)
			}
			if want := (RuntimeCgroupsPath{Parent: wantParent, Prefix: tc.prefix, ID: id}); err != nil || rc != want {
				t.Fatalf("ParseContainerCgroupsPath(%q) = %+v, %v; want %+v", got, rc, err, want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		d    Driver
		in   string
		err  error
	}{
		{"cgroupfs relative", DriverCgroupfs, "kubepods/x", ErrInvalidPath},
		{"cgroupfs dotdot", DriverCgroupfs, "/kubepods/../x", ErrInvalidPath},
		{"cgroupfs no parent", DriverCgroupfs, "/x", ErrInvalidPath},
		{"cgroupfs trailing slash", DriverCgroupfs, "/kubepods/x/", ErrInvalidPath},
		{"cgroupfs hidden id", DriverCgroupfs, "/kubepods/x/.id", ErrInvalidPath},
		{"systemd one part", DriverSystemd, "kubepods.slice", ErrInvalidPath},
		{"systemd four parts", DriverSystemd, "a.slice:p:id:x", ErrInvalidPath},
		{"systemd empty prefix", DriverSystemd, "a.slice::id", ErrInvalidPath},
		{"systemd empty id", DriverSystemd, "a.slice:p:", ErrInvalidPath},
		{"systemd id escapes", DriverSystemd, "a.slice:p:../../x", ErrInvalidPath},
		{"systemd parent is a path", DriverSystemd, "/kubepods.slice/a.slice:p:id", ErrInvalidPath},
		{"systemd parent no slice", DriverSystemd, "a.scope:p:id", ErrInvalidPath},
		{"bad driver", Driver("x"), "/kubepods/x", ErrInvalidDriver},
	} {
		if got, err := ParseContainerCgroupsPath(tc.d, tc.in); !errors.Is(err, tc.err) || got != (RuntimeCgroupsPath{}) {
			t.Errorf("%s: ParseContainerCgroupsPath(%q) = %+v, %v; want %v", tc.name, tc.in, got, err, tc.err)
		}
	}
	for _, tc := range []struct {
		name            string
		d               Driver
		pod, prefix, id string
		err             error
	}{
		{"escaping id", DriverCgroupfs, "kubepods/podx", "", "../x", ErrInvalidPath},
		{"unclean pod", DriverCgroupfs, "/kubepods/podx", "", id, ErrInvalidPath},
		{"systemd pod no slice", DriverSystemd, "kubepods/podx", "cri-containerd", id, ErrInvalidPath},
		{"systemd prefix with colon", DriverSystemd, "kubepods.slice/kubepods-podx.slice", "a:b", id, ErrInvalidPath},
		{"systemd empty prefix", DriverSystemd, "kubepods.slice/kubepods-podx.slice", "", id, ErrInvalidPath},
		{"bad driver", Driver("x"), "kubepods/podx", "", id, ErrInvalidDriver},
	} {
		if got, err := ContainerCgroupsPath(tc.d, tc.pod, tc.prefix, tc.id); !errors.Is(err, tc.err) || got != "" {
			t.Errorf("%s: ContainerCgroupsPath = %q, %v; want %v", tc.name, got, err, tc.err)
		}
	}
}

// Property: ParseCgroupPath, which reads outside input (/proc/<pid>/cgroup of any
// process), fails only with the package's sentinels; a pod it finds has a UID of
// kubelet's form that the input spells, a container ID of hex digits the input
// spells, and a place that this package builds back to a component of the input.
func FuzzParseCgroupPath(f *testing.F) {
	for _, s := range []string{
		"/kubepods/burstable/pod" + knUID + "/" + knCtr,
		"/kubepods/besteffort/understory-batch/pod" + knUID + "/crio-" + knCtr,
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + knEsc + ".slice/cri-containerd-" + knCtr + ".scope",
		"/kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod" + knEsc + ".slice/docker-" + knCtr + ".scope",
		"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + knEsc + ".slice",
		"/a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/a-b-kubepods-besteffort-understory_batch.slice/" +
			"a-b-kubepods-besteffort-understory_batch-pod" + knEsc + ".slice/cri-containerd-" + knCtr + ".scope",
		"/kubelet/kubepods/understory-batch/pod" + knUID + "/" + knCtr,
		"/../../besteffort/pod" + knUID + "/" + knCtr,
		"/../kubepods-pod_.slice/docker-.scope",
		"/kubepods/pod../x",
		"/kubepods/podburstable/besteffort",
		"/machine/pod" + knUID,
		"/",
		"",
		"kubepods/./x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseCgroupPath(in)
		if err != nil {
			if !errors.Is(err, ErrNotPodCgroup) && !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			if got != (PodCgroup{}) {
				t.Fatalf("an error came with a pod: %+v", got)
			}
			return
		}
		if !validUID(got.UID, '-') {
			t.Fatalf("accepted UID %q from %q", got.UID, in)
		}
		if got.Driver != DriverCgroupfs && got.Driver != DriverSystemd {
			t.Fatalf("driver %q from %q", got.Driver, in)
		}
		spelled := got.UID
		if got.Driver == DriverSystemd {
			spelled = escapeUnit(got.UID)
		}
		if !strings.Contains(in, spelled) {
			t.Fatalf("UID %q is not in %q", got.UID, in)
		}
		if c := got.ContainerID; c != "" && (!validContainerID(c) || !strings.Contains(in, c)) {
			t.Fatalf("accepted container ID %q from %q", c, in)
		}
		if got.Tier != "" && validTierName(got.Tier) != nil {
			t.Fatalf("accepted tier %q from %q", got.Tier, in)
		}
		if got.QOS == 0 {
			return // hidden by a cgroup namespace
		}
		// The pod cgroup, built from what was parsed, is a component of the input.
		var pod string
		n := Naming{Driver: got.Driver}
		if got.Tier == "" {
			pod, err = n.PodPath(got.QOS, got.UID)
		} else {
			var tier string
			if tier, err = n.TierPathIn(got.QOS, got.Tier); err == nil {
				pod, err = TierPodPath(got.Driver, tier, got.UID)
			}
		}
		if err != nil {
			t.Fatalf("%+v from %q does not build: %v", got, in, err)
		}
		last := path.Base(pod)
		if got.Driver == DriverSystemd {
			// Below a kubelet --cgroup-root the unit carries the root's chain.
			last = strings.TrimPrefix(last, "kubepods")
		}
		found := false
		for _, c := range strings.Split(in, "/") {
			if strings.HasSuffix(c, last) {
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("%+v from %q: no component ends in %q", got, in, last)
		}
	})
}

// Property: kubelet's --cgroup-root comes from the agent's configuration. A root
// Naming accepts yields, for any accepted UID, clean paths in which kubepods sits in
// the root and the pod in its QoS cgroup; under systemd every path is exactly the
// expansion of its last unit (what systemd and runc make of that unit name), and the
// pod's slice parses back to the pod. A refused root refuses every name, with the
// package's sentinels.
func FuzzNaming(f *testing.F) {
	for _, s := range []string{"/", "", "/kubelet", "/a/b", "/my-root/x", "/kubelet.slice", "/a b", "/a/../b", "/.x", "//a//",
		"/a:b", "/" + strings.Repeat("r", 200)} {
		f.Add(s, false, knUID)
		f.Add(s, true, knUID)
	}
	f.Fuzz(func(t *testing.T, root string, systemd bool, uid string) {
		n := Naming{Driver: DriverCgroupfs, Root: root}
		if systemd {
			n.Driver = DriverSystemd
		}
		rootPath, rootErr := n.RootPath()
		if err := n.Validate(); (err == nil) != (rootErr == nil) {
			t.Fatalf("Validate() = %v but RootPath() = %q, %v", err, rootPath, rootErr)
		}
		pod, err := n.PodPath(QOSBestEffort, uid)
		if rootErr != nil {
			if !errors.Is(rootErr, ErrInvalidPath) || !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("refused root %q: RootPath %v, PodPath %q, %v; want ErrInvalidPath", root, rootErr, pod, err)
			}
			if q := n.QOSPath(QOSGuaranteed); q != "" {
				t.Fatalf("refused root %q named kubepods %q", root, q)
			}
			return
		}
		kubepods := n.QOSPath(QOSGuaranteed)
		if _, err := CleanPath(kubepods); err != nil || path.Join(rootPath, path.Base(kubepods)) != kubepods {
			t.Fatalf("root %q: kubepods %q is no clean child of the root %q (%v)", root, kubepods, rootPath, err)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("PodPath(%q): %v does not wrap ErrInvalidPath", uid, err)
			}
			return
		}
		if _, err := CleanPath(pod); err != nil || path.Dir(pod) != n.QOSPath(QOSBestEffort) {
			t.Fatalf("root %q: pod %q is no clean child of BestEffort %q (%v)", root, pod, n.QOSPath(QOSBestEffort), err)
		}
		if !systemd {
			return
		}
		unit, err := SliceUnit(pod)
		if err != nil {
			t.Fatalf("root %q: pod %q has no slice unit: %v", root, pod, err)
		}
		if p, err := SlicePath(unit); err != nil || p != pod {
			t.Fatalf("root %q: slice %q expands to %q, %v; want %q", root, unit, p, err, pod)
		}
		if !validUID(uid, '-') {
			return // a UID of another form (e.g. with '_') does not survive kubelet's escaping
		}
		pc, err := ParsePodCgroupParent(unit)
		if want := (PodCgroup{Driver: DriverSystemd, QOS: QOSBestEffort, UID: uid}); err != nil || pc != want {
			t.Fatalf("root %q: ParsePodCgroupParent(%q) = %+v, %v; want %+v", root, unit, pc, err, want)
		}
	})
}
