package gpu

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

const (
	podUID    = "0b5e6f1c-1111-4222-8333-444455556666"
	podUIDEsc = "0b5e6f1c_1111_4222_8333_444455556666"
	ctrID     = "3f1e2d4c5b6a79881726354453627180a9b8c7d6e5f4031221304f5e6d7c8b9a"
	// staticUID is a static pod's UID: kubelet's hash of the manifest.
	staticUID = "6e5a8c2e5e1d3d6e0f9a8b7c6d5e4f3a"
)

// v1Lines is the v1 part of a real hybrid /proc/<pid>/cgroup, with the pod path
// substituted for %s in the controllers kubelet manages.
func v1File(path string) string {
	return strings.NewReplacer("%s", path).Replace(`12:hugetlb:%s
11:pids:%s
10:net_cls,net_prio:%s
9:perf_event:%s
8:devices:%s
7:cpu,cpuacct:%s
6:blkio:%s
5:memory:%s
4:rdma:/
3:freezer:%s
2:cpuset:%s
1:name=systemd:%s
`)
}

func TestParseProcCgroup(t *testing.T) {
	t.Parallel()
	want := PodRef{UID: podUID, ContainerID: ctrID}
	for _, tc := range []struct {
		name string
		in   string
		want PodRef
		err  error
	}{
		// cgroupfs driver, v2.
		{"cgroupfs burstable", "0::/kubepods/burstable/pod" + podUID + "/" + ctrID + "\n", want, nil},
		{"cgroupfs guaranteed", "0::/kubepods/pod" + podUID + "/" + ctrID + "\n", want, nil},
		{"cgroupfs besteffort", "0::/kubepods/besteffort/pod" + podUID + "/" + ctrID + "\n", want, nil},
		{"cgroupfs cri-o", "0::/kubepods/besteffort/pod" + podUID + "/crio-" + ctrID + "\n", want, nil},
		{"cgroupfs no trailing newline", "0::/kubepods/pod" + podUID + "/" + ctrID, want, nil},
		{"cgroupfs static pod", "0::/kubepods/burstable/pod" + staticUID + "/" + ctrID + "\n",
			PodRef{UID: staticUID, ContainerID: ctrID}, nil},
		{"cgroupfs pod cgroup itself", "0::/kubepods/burstable/pod" + podUID + "\n", PodRef{UID: podUID}, nil},
		{"cgroupfs below the container", "0::/kubepods/burstable/pod" + podUID + "/" + ctrID + "/init\n", want, nil},
		{"cgroupfs not a container name", "0::/kubepods/burstable/pod" + podUID + "/init\n", PodRef{UID: podUID}, nil},
		{"cgroupfs removed cgroup", "0::/kubepods/burstable/pod" + podUID + "/" + ctrID + " (deleted)\n", want, nil},
		// systemd driver, v2.
		{"systemd burstable containerd",
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUIDEsc +
				".slice/cri-containerd-" + ctrID + ".scope\n", want, nil},
		{"systemd guaranteed docker",
			"0::/kubepods.slice/kubepods-pod" + podUIDEsc + ".slice/docker-" + ctrID + ".scope\n", want, nil},
		{"systemd besteffort crio",
			"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + podUIDEsc +
				".slice/crio-" + ctrID + ".scope\n", want, nil},
		{"systemd crio conmon is no container",
			"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + podUIDEsc +
				".slice/crio-conmon-" + ctrID + ".scope\n", PodRef{UID: podUID}, nil},
		{"systemd kubelet cgroup root (kind)",
			"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/" +
				"kubelet-kubepods-besteffort-pod" + podUIDEsc + ".slice/cri-containerd-" + ctrID + ".scope\n", want, nil},
		// The agent's batch tier (the NRI plugin's nriPodCgroup below config.TierCgroup), both parents, both drivers.
		{"tier cgroupfs below kubepods",
			"0::/kubepods/understory-batch/pod" + podUID + "/" + ctrID + "\n", want, nil},
		{"tier cgroupfs below besteffort",
			"0::/kubepods/besteffort/understory-batch/pod" + podUID + "/" + ctrID + "\n", want, nil},
		{"tier systemd below kubepods",
			"0::/kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod" + podUIDEsc +
				".slice/cri-containerd-" + ctrID + ".scope\n", want, nil},
		{"tier systemd below besteffort",
			"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-understory_batch.slice/" +
				"kubepods-besteffort-understory_batch-pod" + podUIDEsc + ".slice/cri-containerd-" + ctrID + ".scope\n",
			want, nil},
		{"tier with kubelet root prefix",
			"0::/custom/kubepods/understory-batch/pod" + podUID + "/" + ctrID + "\n", want, nil},
		// v1 and hybrid.
		{"v1 cgroupfs", v1File("/kubepods/burstable/pod" + podUID + "/" + ctrID), want, nil},
		{"v1 systemd", v1File("/kubepods.slice/kubepods-pod" + podUIDEsc + ".slice/cri-containerd-" + ctrID + ".scope"),
			want, nil},
		{"hybrid prefers the v1 memory line",
			v1File("/kubepods/besteffort/pod"+podUID+"/"+ctrID) + "0::/\n", want, nil},
		{"hybrid judges the v1 line even when the v2 one names a pod",
			v1File("/system.slice/containerd.service") + "0::/kubepods/besteffort/pod" + podUID + "/" + ctrID + "\n",
			PodRef{}, ErrNotPod},
		{"v1 without memory uses cpu",
			"3:cpu,cpuacct:/kubepods/pod" + podUID + "/" + ctrID + "\n1:name=systemd:/\n", want, nil},
		{"v1 memory beats cpu",
			"3:cpu,cpuacct:/\n2:memory:/kubepods/pod" + podUID + "/" + ctrID + "\n", want, nil},
		// A private cgroup namespace shows other cgroups relative to the reader's.
		{"private cgroupns cgroupfs", "0::/../../../besteffort/pod" + podUID + "/" + ctrID + "\n", want, nil},
		{"private cgroupns systemd",
			"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod" + podUIDEsc +
				".slice/cri-containerd-" + ctrID + ".scope\n", want, nil},
		{"private cgroupns systemd pod first",
			"0::/../kubepods-besteffort-pod" + podUIDEsc + ".slice/cri-containerd-" + ctrID + ".scope\n", want, nil},
		// Nested: the outermost pod is this node's.
		{"pod inside a pod",
			"0::/kubepods/burstable/pod" + podUID + "/" + ctrID + "/kubelet.slice/kubelet-kubepods.slice/" +
				"kubelet-kubepods-pod1111.slice/cri-containerd-abc.scope\n", want, nil},
		{"docker in docker", "0::/docker/" + ctrID + "/kubepods/besteffort/pod" + podUID + "/" + ctrID + "\n", want, nil},
		// Not a pod.
		{"root", "0::/\n", PodRef{}, ErrNotPod},
		{"system service", "0::/system.slice/nvidia-persistenced.service\n", PodRef{}, ErrNotPod},
		{"user session", "0::/user.slice/user-0.slice/session-3.scope\n", PodRef{}, ErrNotPod},
		{"qos cgroup", "0::/kubepods/besteffort\n", PodRef{}, ErrNotPod},
		{"pod-like name outside kubepods", "0::/machine/pod" + podUID + "/" + ctrID + "\n", PodRef{}, ErrNotPod},
		{"podman", "0::/user.slice/libpod_parent/podman-1.scope\n", PodRef{}, ErrNotPod},
		{"systemd pod slice in a foreign parent",
			"0::/kubepods.slice/other.slice/kubepods-besteffort-pod" + podUIDEsc + ".slice/x.scope\n", PodRef{}, ErrNotPod},
		{"systemd slice without kubepods",
			"0::/machine.slice/machine-pod" + podUIDEsc + ".slice\n", PodRef{}, ErrNotPod},
		{"systemd empty uid", "0::/kubepods.slice/kubepods-pod.slice\n", PodRef{}, ErrNotPod},
		// Only the shapes kubelet and the tier make: no pod at an unknown depth below
		// kubepods, no slice chain with foreign parts.
		{"cgroupfs unknown groups below kubepods", "0::/kubepods/a/b/pod" + podUID + "/" + ctrID + "\n", PodRef{}, ErrNotPod},
		{"systemd foreign slice chain",
			"0::/kubepods.slice/kubepods-a-b.slice/kubepods-a-b-pod" + podUIDEsc + ".slice/cri-containerd-" + ctrID + ".scope\n",
			PodRef{}, ErrNotPod},
		{"uid with a bad byte", "0::/kubepods/pod" + podUID + "+x/" + ctrID + "\n", PodRef{}, ErrNotPod},
		{"uid too long", "0::/kubepods/pod" + strings.Repeat("a", 129) + "/" + ctrID + "\n", PodRef{}, ErrNotPod},
		{"only other v1 controllers", "4:rdma:/\n1:name=systemd:/kubepods/pod" + podUID + "\n", PodRef{}, ErrNotPod},
		// Malformed.
		{"empty", "", PodRef{}, ErrMalformedCgroup},
		{"blank lines", "\n\n", PodRef{}, ErrMalformedCgroup},
		{"no colons", "garbage\n", PodRef{}, ErrMalformedCgroup},
		{"one colon", "0:/kubepods\n", PodRef{}, ErrMalformedCgroup},
		{"bad hierarchy id", "x::/kubepods\n", PodRef{}, ErrMalformedCgroup},
		{"negative hierarchy id", "-1::/kubepods\n", PodRef{}, ErrMalformedCgroup},
		{"huge hierarchy id", "99999999999:cpu:/\n", PodRef{}, ErrMalformedCgroup},
		{"v1 without controllers", "3::/kubepods\n", PodRef{}, ErrMalformedCgroup},
		{"v2 with controllers", "0:cpu:/kubepods\n", PodRef{}, ErrMalformedCgroup},
		{"relative path", "0::kubepods/pod" + podUID + "\n", PodRef{}, ErrMalformedCgroup},
		{"two v2 lines", "0::/\n0::/kubepods/pod" + podUID + "\n", PodRef{}, ErrMalformedCgroup},
		{"two memory lines", "5:memory:/\n6:memory:/\n", PodRef{}, ErrMalformedCgroup},
		{"two cpu lines", "5:cpu:/\n6:cpu,cpuacct:/\n", PodRef{}, ErrMalformedCgroup},
		{"dotdot inside", "0::/kubepods/../pod" + podUID + "\n", PodRef{}, ErrMalformedCgroup},
		{"dot inside", "0::/kubepods/./pod" + podUID + "\n", PodRef{}, ErrMalformedCgroup},
		{"control byte", "0::/kubepods/pod" + podUID + "\x01\n", PodRef{}, ErrMalformedCgroup},
		{"bad later line", "0::/kubepods/pod" + podUID + "\nnonsense\n", PodRef{}, ErrMalformedCgroup},
		{"too large", "0::/" + strings.Repeat("a", maxProcCgroup) + "\n", PodRef{}, ErrMalformedCgroup},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseProcCgroup([]byte(tc.in))
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("got %+v, %v; want error %v", got, err, tc.err)
				}
				if got != (PodRef{}) {
					t.Fatalf("an error came with a pod: %+v", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			if !got.Attributed() {
				t.Fatal("a parsed pod is not Attributed")
			}
		})
	}
}

// writeCgroup writes <root>/<pid>/cgroup.
func writeCgroup(t testing.TB, root string, pid uint32, data string) {
	t.Helper()
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestPodOfPID(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeCgroup(t, root, 100, "0::/kubepods/burstable/pod"+podUID+"/"+ctrID+"\n")
	writeCgroup(t, root, 200, v1File("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"+
		podUIDEsc+".slice/docker-"+ctrID+".scope")+"0::/\n")
	writeCgroup(t, root, 300, "0::/system.slice/nvidia-persistenced.service\n")
	writeCgroup(t, root, 400, "what\n")
	writeCgroup(t, root, 500, "0::/"+strings.Repeat("k/", maxProcCgroup/2)+"\n")
	// 600: /proc/600 exists but its cgroup file vanished with the process.
	if err := os.MkdirAll(filepath.Join(root, "600"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := PodRef{UID: types.UID(podUID), ContainerID: ctrID}
	for _, tc := range []struct {
		name string
		pid  uint32
		want PodRef
		err  error
	}{
		{"v2 cgroupfs", 100, want, nil},
		{"hybrid systemd", 200, want, nil},
		{"system process", 300, PodRef{}, ErrNotPod},
		{"malformed", 400, PodRef{}, ErrMalformedCgroup},
		{"oversized file", 500, PodRef{}, ErrMalformedCgroup},
		{"exited", 600, PodRef{}, ErrProcessGone},
		{"never existed (or another PID namespace)", 700, PodRef{}, ErrProcessGone},
		{"pid 0", 0, PodRef{}, ErrProcessGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := PodOfPID(root, tc.pid)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || got != (PodRef{}) {
					t.Fatalf("got %+v, %v; want error %v", got, err, tc.err)
				}
				if tc.err == ErrProcessGone && !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("%v does not wrap fs.ErrNotExist", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestPodOfPIDReal reads this test's own /proc entry: a real kernel's file parses
// (as no pod, since tests do not run in one, unless CI runs them inside a pod).
func TestPodOfPIDReal(t *testing.T) {
	t.Parallel()
	_, err := PodOfPID("/proc", uint32(os.Getpid()))
	if err != nil && !errors.Is(err, ErrNotPod) {
		t.Fatalf("the kernel's own /proc/self/cgroup: %v", err)
	}
}

// The forms a parsed pod UID and container ID take.
var (
	uidForm         = regexp.MustCompile(`^[A-Za-z0-9-]{1,128}$`)
	containerIDForm = regexp.MustCompile(`^[0-9a-f]{1,128}$`)
)

func FuzzParseProcCgroup(f *testing.F) {
	for _, s := range []string{
		"0::/kubepods/burstable/pod" + podUID + "/" + ctrID + "\n",
		"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUIDEsc +
			".slice/cri-containerd-" + ctrID + ".scope\n",
		"0::/kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod" + podUIDEsc +
			".slice/cri-containerd-" + ctrID + ".scope\n",
		v1File("/kubepods/besteffort/pod"+podUID+"/"+ctrID) + "0::/\n",
		"0::/../../besteffort/pod" + podUID + "/" + ctrID + " (deleted)\n",
		"0::/../kubepods-pod_.slice/docker-.scope\n",
		"0::/\n",
		"5:memory:/\n6:memory:/\n",
		"0:cpu:x\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseProcCgroup(b)
		if err != nil {
			if !errors.Is(err, ErrNotPod) && !errors.Is(err, ErrMalformedCgroup) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			if got != (PodRef{}) {
				t.Fatalf("an error came with a pod: %+v", got)
			}
			return
		}
		uid := string(got.UID)
		if !uidForm.MatchString(uid) {
			t.Fatalf("accepted UID %q", uid)
		}
		if !strings.Contains(string(b), uid) && !strings.Contains(string(b), strings.ReplaceAll(uid, "-", "_")) {
			t.Fatalf("UID %q is not in the input", uid)
		}
		if c := got.ContainerID; c != "" && (!containerIDForm.MatchString(c) || !strings.Contains(string(b), c)) {
			t.Fatalf("accepted container ID %q", c)
		}
	})
}

// statLine is a /proc/<pid>/stat line of process pid, named comm, started at start.
func statLine(pid uint32, comm string, start uint64) string {
	return strconv.FormatUint(uint64(pid), 10) + " (" + comm + ") S 1 1234 1234 0 -1 4194560 1234 0 0 0 " +
		"10 5 0 0 20 0 8 0 " + strconv.FormatUint(start, 10) + " 1000000 200 18446744073709551615 1 1 0 0 0\n"
}

// writeStat writes <root>/<pid>/stat.
func writeStat(t testing.TB, root string, pid uint32, start uint64) {
	t.Helper()
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(statLine(pid, "python3", start)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseStatStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		want uint64
		ok   bool
	}{
		{"plain", statLine(42, "python3", 123456), 123456, true},
		{"spaces and parentheses in the name", statLine(42, "a) (b c) S 9", 77), 77, true},
		{"cut after starttime", "42 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99", 99, true},
		{"largest", statLine(42, "x", math.MaxUint64), math.MaxUint64, true},
		{"overflow", strings.Replace(statLine(42, "x", 1), " 0 1 1000000", " 0 18446744073709551616 1000000", 1), 0, false},
		{"too few fields", "42 (x) S 1 1 1 0 -1 0 0 0\n", 0, false},
		{"no name", "42 x S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99\n", 0, false},
		{"not a number", "42 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 9x9 1\n", 0, false},
		{"negative", "42 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -9 1\n", 0, false},
		{"empty", "", 0, false},
	} {
		got, err := parseStatStart([]byte(tc.in))
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("%s: parseStatStart = %d, %v; want %d, ok %t", tc.name, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, errMalformedStat) {
			t.Errorf("%s: error wraps no sentinel: %v", tc.name, err)
		}
	}
}

func TestProcessStart(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeStat(t, root, 7, 4242)
	buf := make([]byte, statBufSize)
	if got, err := processStart(root, 7, buf); err != nil || got != 4242 {
		t.Fatalf("processStart = %d, %v; want 4242", got, err)
	}
	if _, err := processStart(root, 8, buf); !errors.Is(err, ErrProcessGone) {
		t.Fatalf("no /proc entry: %v, want ErrProcessGone", err)
	}
	// The real /proc: this process's start time, as the kernel writes it.
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	want, err := strconv.ParseUint(fields[statStartField], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := processStart("/proc", uint32(os.Getpid()), buf); err != nil || got != want {
		t.Fatalf("processStart of this process = %d, %v; want %d", got, err, want)
	}
}

func FuzzParseStatStart(f *testing.F) {
	for _, s := range []string{
		statLine(42, "python3", 123456),
		statLine(42, "a) (b", 1),
		"42 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99",
		"42 (x) S\n",
		")",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseStatStart(b)
		if err != nil {
			if !errors.Is(err, errMalformedStat) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			if got != 0 {
				t.Fatalf("an error came with a start time %d", got)
			}
			return
		}
		// Whatever parsed is field 22, counted from the last ')' between spaces and
		// newlines as the kernel writes them, in decimal.
		fields := strings.FieldsFunc(string(b[bytes.LastIndexByte(b, ')')+1:]),
			func(r rune) bool { return r == ' ' || r == '\n' })
		if len(fields) <= statStartField {
			t.Fatalf("parsed %d from %q, which has no field 22", got, b)
		}
		if want, err := strconv.ParseUint(fields[statStartField], 10, 64); err != nil || want != got {
			t.Fatalf("parsed %d from %q; field 22 is %q", got, b, fields[statStartField])
		}
	})
}
