package colo

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// The load generator stands for clients on other machines, so its own scheduling
// delays must not show up as the LS service's latency. Its cgroup has the largest
// weight, but weight alone is not enough under EEVDF: a woken task preempts the running
// entity only when its deadline is earlier, and the fake node's kubepods entity (which
// runs batch at the top level: batch is idle only relative to the LS pods) keeps the CPU
// for up to a base slice (~1.5 ms on 2 CPUs). A short custom slice (sched_attr
// sched_runtime, Linux >= 6.6) makes every wake-up of the load generator preempt at
// once. Children inherit a custom slice through fork, so the LS server, the batch
// workers and the agent are started from a thread with the default slice.

// loadgenSlice is the load generator's slice: the kernel's minimum.
const loadgenSlice = 100_000 // ns

// setSlice sets the EEVDF slice of every thread of this process (0: the default).
func setSlice(ns uint64) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := setThreadSlice(tid, ns); err != nil {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	return nil
}

func setThreadSlice(tid int, ns uint64) error {
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL, Runtime: ns}
	if err := unix.SchedSetAttr(tid, attr, 0); err != nil && err != unix.ESRCH {
		return err
	}
	return nil
}

// startDefaultSlice starts cmd from a thread with the default slice, so that the child
// does not inherit the load generator's short one.
func startDefaultSlice(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	if err := setThreadSlice(tid, 0); err != nil {
		return fmt.Errorf("resetting the slice before starting %s: %w", cmd.Path, err)
	}
	err := cmd.Start()
	if serr := setThreadSlice(tid, loadgenSlice); err == nil && serr != nil {
		err = serr
	}
	return err
}
