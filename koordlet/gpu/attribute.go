package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
)

// Sentinels of ParseProcCgroup and PodOfPID. A process they cannot attribute is
// counted on its GPU but belongs to no pod; none of them is fatal.
var (
	// ErrNotPod: the process's cgroup is not a pod's (a system daemon, the root of
	// another cgroup namespace, a non-Kubernetes container).
	ErrNotPod = errors.New("process is not in a pod cgroup")
	// ErrMalformedCgroup: /proc/<pid>/cgroup did not have the kernel's format.
	ErrMalformedCgroup = errors.New("malformed /proc/<pid>/cgroup")
	// ErrProcessGone: no /proc/<pid> (the process exited, or lives in a PID namespace
	// the proc root does not show). It wraps fs.ErrNotExist.
	ErrProcessGone = fmt.Errorf("process has no /proc entry: %w", fs.ErrNotExist)
	// errMalformedStat: /proc/<pid>/stat did not have the kernel's format.
	errMalformedStat = errors.New("malformed /proc/<pid>/stat")
)

// Indices of proc(5)'s /proc/<pid>/stat fields among the fields after the command
// name's closing parenthesis (the first of them, state, is field 3): utime and stime
// (fields 14 and 15, clock ticks the process and its threads ran in user and kernel
// mode) and starttime (field 22, clock ticks since boot).
const (
	statUtimeField = 14 - 3
	statStimeField = 15 - 3
	statStartField = 22 - 3
)

// statBufSize is a buffer that holds /proc/<pid>/stat up to its starttime field:
// pid, comm (16 bytes, but a ')' in it is not escaped) and 20 numbers of at most 20
// digits.
const statBufSize = 1024

// processStat is what the GPU loop reads of a process's /proc/<pid>/stat.
type processStat struct {
	// start is the start time (clock ticks since boot): with the PID, it names one
	// process, as a PID is reused only after its process exited.
	start uint64
	// cpuTicks is utime + stime: the CPU the process (all its threads) has used, in
	// clock ticks (USER_HZ).
	cpuTicks uint64
}

// processStart returns the start time of process pid (field 22 of <procRoot>/<pid>/stat).
// buf (statBufSize bytes or more) is scratch space, so that a scrape reads every
// process without allocating a buffer each. A process without a /proc entry yields
// ErrProcessGone.
func processStart(procRoot string, pid uint32, buf []byte) (uint64, error) {
	st, err := readProcessStat(procRoot, pid, buf)
	return st.start, err
}

// readProcessStat reads and parses <procRoot>/<pid>/stat (see processStart).
func readProcessStat(procRoot string, pid uint32, buf []byte) (processStat, error) {
	path := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "stat")
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return processStat{}, fmt.Errorf("pid %d: %w", pid, ErrProcessGone)
		}
		return processStat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf)
	switch {
	case errors.Is(err, syscall.ESRCH):
		return processStat{}, fmt.Errorf("pid %d: %w", pid, ErrProcessGone)
	case err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF):
		return processStat{}, fmt.Errorf("reading %s: %w", path, err)
	}
	st, err := parseStat(buf[:n])
	if err != nil {
		return processStat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// parseStatStart returns the starttime field of a /proc/<pid>/stat line (see parseStat).
func parseStatStart(data []byte) (uint64, error) {
	st, err := parseStat(data)
	return st.start, err
}

// parseStat parses a /proc/<pid>/stat line (or its beginning, through starttime). The
// command name may hold spaces and ')': fields are counted from the last ')'.
func parseStat(data []byte) (processStat, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return processStat{}, fmt.Errorf("no ')' after the command name: %w", errMalformedStat)
	}
	var st processStat
	rest := data[i+1:]
	for k := 0; ; k++ {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		field := rest[:end]
		if len(field) == 0 {
			return processStat{}, fmt.Errorf("%d fields after the command name, want %d: %w", k,
				statStartField+1, errMalformedStat)
		}
		var name string
		var dst *uint64
		switch k {
		case statUtimeField:
			name, dst = "utime", &st.cpuTicks
		case statStimeField:
			name = "stime"
		case statStartField:
			name, dst = "starttime", &st.start
		}
		if name != "" {
			v, ok := parseUint(field)
			if !ok {
				return processStat{}, fmt.Errorf("%s %q: %w", name, clip(string(field)), errMalformedStat)
			}
			if dst == nil { // stime: added to utime
				if st.cpuTicks > math.MaxUint64-v {
					return processStat{}, fmt.Errorf("utime + stime overflow: %w", errMalformedStat)
				}
				v += st.cpuTicks
				dst = &st.cpuTicks
			}
			*dst = v
			if k == statStartField {
				return st, nil
			}
		}
		rest = rest[end:]
	}
}

// parseUint parses decimal digits without allocating (strconv wants a string).
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
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

// maxProcCgroup bounds the read of /proc/<pid>/cgroup: about a dozen v1
// hierarchies plus the unified one, each path at most PATH_MAX (4096) bytes.
const maxProcCgroup = 64 << 10

// PodOfPID returns the pod of process pid, read from <procRoot>/<pid>/cgroup.
// A process without a /proc entry yields ErrProcessGone (errors.Is(err,
// fs.ErrNotExist) holds too); one outside pods ErrNotPod.
//
// procRoot must show the host's PID namespace (the agent runs with hostPID):
// NVML reports host PIDs, and a private /proc would show other processes, or
// none, under those numbers.
func PodOfPID(procRoot string, pid uint32) (PodRef, error) {
	if pid == 0 {
		return PodRef{}, fmt.Errorf("pid 0: %w", ErrProcessGone)
	}
	data, err := readProcFile(procRoot, pid, "cgroup", maxProcCgroup, ErrMalformedCgroup, nil)
	if err != nil {
		return PodRef{}, err
	}
	ref, err := ParseProcCgroup(data)
	if err != nil {
		return PodRef{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return ref, nil
}

// readProcFile reads <procRoot>/<pid>/<name>, at most most bytes, into buf[:0] (grown
// as needed; nil allocates). A process without a /proc entry, or one that exits while
// its file is open (ESRCH), yields ErrProcessGone; a longer file yields tooLarge.
func readProcFile(procRoot string, pid uint32, name string, most int, tooLarge error, buf []byte) ([]byte, error) {
	path := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), name)
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return buf, fmt.Errorf("pid %d: %w", pid, ErrProcessGone)
		}
		return buf, fmt.Errorf("pid %d: %w", pid, err)
	}
	defer f.Close()
	b := bytes.NewBuffer(buf[:0])
	_, err = b.ReadFrom(io.LimitReader(f, int64(most)+1))
	data := b.Bytes()
	switch {
	case errors.Is(err, syscall.ESRCH):
		return data, fmt.Errorf("pid %d: %w", pid, ErrProcessGone)
	case err != nil:
		return data, fmt.Errorf("reading %s: %w", path, err)
	case len(data) > most:
		return data, fmt.Errorf("%s is larger than %d bytes: %w", path, most, tooLarge)
	}
	return data, nil
}

// ParseProcCgroup returns the pod (and container) named by the contents of a
// /proc/<pid>/cgroup file.
//
// It reads one line, chosen the same way for every process so that all of a
// node's processes are judged in the same hierarchy: the v1 memory line, else the
// v1 cpu line, else the v2 line ("0::/path"). On hybrid hosts the v1 controllers
// are where kubelet and the runtime place containers; the unified hierarchy may
// show only systemd's view.
//
// The path is then read with kubelet's naming for either driver
// (cgroups.ParseCgroupPath): the first, outermost pod cgroup, kubelet's or one
// below the agent's batch tier, is this node's pod (a nested one belongs to a
// kubelet running inside a pod), and the component below it names the container
// when a runtime named it ("<id>", "crio-<id>", "cri-containerd-<id>.scope", ...);
// anything else (conmon, a runtime's own group) leaves ContainerID empty. Paths
// shown relative to the reader's cgroup namespace ("/../../besteffort/...", when
// the agent runs in a private cgroup namespace) are accepted: the leading ".." are
// dropped, and the kubepods ancestor need not be visible.
func ParseProcCgroup(data []byte) (PodRef, error) {
	if len(data) > maxProcCgroup {
		return PodRef{}, fmt.Errorf("%d bytes, more than %d: %w", len(data), maxProcCgroup, ErrMalformedCgroup)
	}
	var memPath, cpuPath, v2Path string
	var haveMem, haveCPU, haveV2 bool
	lines := 0
	for len(data) > 0 {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		if len(line) == 0 {
			continue
		}
		lines++
		id, controllers, path, err := splitCgroupLine(line)
		if err != nil {
			return PodRef{}, fmt.Errorf("line %d: %w", lines, err)
		}
		if id == 0 {
			if haveV2 {
				return PodRef{}, fmt.Errorf("line %d: second v2 line: %w", lines, ErrMalformedCgroup)
			}
			haveV2, v2Path = true, path
			continue
		}
		for c := range strings.SplitSeq(controllers, ",") {
			switch c {
			case "memory":
				if haveMem {
					return PodRef{}, fmt.Errorf("line %d: second memory line: %w", lines, ErrMalformedCgroup)
				}
				haveMem, memPath = true, path
			case "cpu":
				if haveCPU {
					return PodRef{}, fmt.Errorf("line %d: second cpu line: %w", lines, ErrMalformedCgroup)
				}
				haveCPU, cpuPath = true, path
			}
		}
	}
	var path string
	switch {
	case lines == 0:
		return PodRef{}, fmt.Errorf("empty: %w", ErrMalformedCgroup)
	case haveMem:
		path = memPath
	case haveCPU:
		path = cpuPath
	case haveV2:
		path = v2Path
	default:
		return PodRef{}, fmt.Errorf("no memory, cpu or v2 line: %w", ErrNotPod)
	}
	return podFromPath(path)
}

// splitCgroupLine splits "hierarchy-ID:controller-list:cgroup-path". The v2 line
// has ID 0 and an empty controller list; v1 lines a positive ID and a non-empty
// list. The path is absolute; a cgroup removed under the process reads
// "<path> (deleted)" on v2, and the suffix is dropped.
func splitCgroupLine(line []byte) (id uint64, controllers, path string, err error) {
	s := string(line)
	idStr, rest, ok1 := strings.Cut(s, ":")
	controllers, path, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 {
		return 0, "", "", fmt.Errorf("%q is not ID:controllers:path: %w", clip(s), ErrMalformedCgroup)
	}
	if idStr == "" || len(idStr) > 10 || strings.TrimLeft(idStr, "0123456789") != "" {
		return 0, "", "", fmt.Errorf("hierarchy ID %q: %w", clip(idStr), ErrMalformedCgroup)
	}
	id, err = strconv.ParseUint(idStr, 10, 32)
	if err != nil {
		return 0, "", "", fmt.Errorf("hierarchy ID %q: %w", clip(idStr), ErrMalformedCgroup)
	}
	if (id == 0) != (controllers == "") {
		return 0, "", "", fmt.Errorf("hierarchy %d with controllers %q: %w", id, clip(controllers), ErrMalformedCgroup)
	}
	path = strings.TrimSuffix(path, " (deleted)")
	if !strings.HasPrefix(path, "/") {
		return 0, "", "", fmt.Errorf("cgroup path %q is not absolute: %w", clip(path), ErrMalformedCgroup)
	}
	for i := 0; i < len(path); i++ {
		if c := path[i]; c < 0x20 || c == 0x7f {
			return 0, "", "", fmt.Errorf("cgroup path has control byte %#x: %w", c, ErrMalformedCgroup)
		}
	}
	return id, controllers, path, nil
}

// podFromPath finds the pod cgroup in an absolute cgroup path with kubelet's naming
// (cgroups.ParseCgroupPath).
func podFromPath(path string) (PodRef, error) {
	pc, err := cgroups.ParseCgroupPath(path)
	switch {
	case errors.Is(err, cgroups.ErrInvalidPath):
		return PodRef{}, fmt.Errorf("%w: %w", ErrMalformedCgroup, err)
	case err != nil:
		return PodRef{}, fmt.Errorf("%w: %w", ErrNotPod, err)
	}
	return PodRef{UID: types.UID(pc.UID), ContainerID: pc.ContainerID}, nil
}

// clip shortens outside input quoted in an error.
func clip(s string) string {
	const max = 80
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
