package schedbench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// selfName is the key of the benchmark's own process in cpuTimes.
const selfName = "benchmark"

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat: 100
// on every Linux architecture Go supports.
const clockTicks = 100

var errStat = errors.New("malformed /proc stat line")

// statCPU parses a /proc/<pid>/stat line into its command name, parent pid
// and user + system CPU time.
func statCPU(line string) (comm string, ppid int, cpu time.Duration, err error) {
	open, closing := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || closing < open {
		return "", 0, 0, fmt.Errorf("%q: %w", line, errStat)
	}
	comm = line[open+1 : closing]
	// After "(comm)": state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime ...
	f := strings.Fields(line[closing+1:])
	if len(f) < 13 {
		return "", 0, 0, fmt.Errorf("%q has %d fields after the name: %w", line, len(f), errStat)
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return "", 0, 0, fmt.Errorf("ppid %q: %w", f[1], errStat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return "", 0, 0, fmt.Errorf("cpu ticks %q: %w", s, errStat)
		}
		ticks += v
	}
	return comm, ppid, time.Duration(ticks) * time.Second / clockTicks, nil
}

// cpuTimes returns the CPU time used so far by the process self and by its
// live children, summed by command name (the kernel truncates names to 15
// bytes: "kube-scheduler" fits, "kube-apiserver" fits). procRoot is /proc.
func cpuTimes(procRoot string, self int) map[string]time.Duration {
	out := map[string]time.Duration{}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		comm, ppid, cpu, err := statCPU(strings.TrimSpace(string(b)))
		switch {
		case err != nil:
		case pid == self:
			out[selfName] += cpu
		case ppid == self:
			out[comm] += cpu
		}
	}
	return out
}

// cpuDelta is after - before per name, in seconds; names whose process
// started in between count from 0, names that vanished are left out.
func cpuDelta(before, after map[string]time.Duration) map[string]float64 {
	out := make(map[string]float64, len(after))
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d.Seconds()
		}
	}
	return out
}
