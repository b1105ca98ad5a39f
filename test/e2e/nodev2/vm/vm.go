// Package vm boots the cgroup v2 + systemd node image (scripts/nodev2/build.sh) under
// qemu's software emulation for a test, and runs commands in it through the qemu guest
// agent: no network is needed to drive the guest, so a broken kubelet or link can still
// be inspected.
//
// Each VM opens the cached root image with snapshot=on (nothing a run does reaches the
// cache), gets a read-only payload disk made from a directory of the test's
// (/opt/understory in the guest, whose boot.sh runs at boot) and a writable scratch disk
// (/var/lib/understory-out). The serial console goes to a log file the test keeps.
package vm

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrNoImage means the node image is not built (scripts/nodev2/build.sh, `make nodev2-image`).
var ErrNoImage = errors.New("cgroup v2 node image not built")

// ErrNoQemu means qemu-system-x86_64 is not installed.
var ErrNoQemu = errors.New("qemu-system-x86_64 not found")

// errAgent is an error reply of the guest agent.
var errAgent = errors.New("guest agent")

// Config is one VM.
type Config struct {
	// ImageDir holds rootfs.img, vmlinuz and initrd.img (build.sh --print-dir).
	ImageDir string
	// Payload is a directory whose contents become the guest's /opt/understory; a
	// boot.sh there runs at boot. Empty: no payload disk.
	Payload string
	// MemoryMiB and CPUs size the guest (defaults 3072 and 2).
	MemoryMiB, CPUs int
	// Tap, when set, is a tap device of this host the guest's eth0 is attached to
	// (virtio-net, MAC MAC); without it the guest has no network at all.
	Tap, MAC string
	// ScratchMiB sizes the writable scratch disk (default 256).
	ScratchMiB int
	// Dir holds the VM's files (disks, sockets, console.log); default tb.TempDir().
	Dir string
}

// VM is a running guest.
type VM struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	// waitErr is qemu's exit, set before done closes.
	waitErr error

	mu   sync.Mutex // one guest-agent exchange at a time
	conn net.Conn
	rd   *bufio.Reader
	seq  int
}

// ImageDir returns the cache directory build.sh prints, or ErrNoImage.
func ImageDir(repoRoot string) (string, error) {
	out, err := exec.Command(filepath.Join(repoRoot, "scripts/nodev2/build.sh"), "--print-dir").Output()
	if err != nil {
		return "", fmt.Errorf("scripts/nodev2/build.sh --print-dir: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	for _, f := range []string{"rootfs.img", "vmlinuz", "initrd.img"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("%s: %w (run scripts/nodev2/build.sh): %w", dir, ErrNoImage, err)
		}
	}
	return dir, nil
}

// Start boots the guest and waits until its guest agent answers (systemd is up and
// the payload's boot.sh may be running). The VM is killed in tb's cleanup, its console
// log printed when tb failed.
func Start(ctx context.Context, tb testing.TB, c Config) (*VM, error) {
	tb.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoQemu, err)
	}
	if c.Dir == "" {
		c.Dir = tb.TempDir()
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 3072
	}
	if c.CPUs == 0 {
		c.CPUs = 2
	}
	if c.ScratchMiB == 0 {
		c.ScratchMiB = 256
	}
	scratch := filepath.Join(c.Dir, "scratch.img")
	if err := mkfs(ctx, scratch, "us-scratch", "", c.ScratchMiB); err != nil {
		return nil, err
	}
	qga := filepath.Join(c.Dir, "qga.sock")
	args := []string{
		"-machine", "q35", "-m", strconv.Itoa(c.MemoryMiB), "-smp", strconv.Itoa(c.CPUs),
		"-nographic", "-no-reboot", "-nodefaults",
		"-kernel", filepath.Join(c.ImageDir, "vmlinuz"), "-initrd", filepath.Join(c.ImageDir, "initrd.img"),
		// nokaslr keeps the kernel's addresses those of the symbols saved at start
		// (Diagnose); loglevel 5 puts warnings (the OOM killer's) on the console.
		// trace_event turns the scheduler's tracepoints on at boot, while one CPU
		// runs, and they stay on (their ring buffer off, see prepare): attaching
		// the agent's eBPF programs to them then patches no kernel code. qemu 7.2's
		// multi-threaded emulation does not survive the kernel patching the
		// tracepoint's jump in __schedule while the other vCPU runs it: both vCPUs
		// loop on the int3 of the patch with interrupts off and the guest is gone
		// (seen with Diagnose in about one TestNodeV2 run in seven, at the agent's
		// start; a loop that attaches and detaches the probe hangs it within
		// minutes). Real CPUs do not have this problem.
		"-append", "console=ttyS0 root=/dev/vda rw systemd.unified_cgroup_hierarchy=1 net.ifnames=0 loglevel=5 nokaslr" +
			" trace_event=sched:sched_switch,sched:sched_wakeup,sched:sched_wakeup_new panic=-1 systemd.show_status=0",
		"-qmp", "unix:" + filepath.Join(c.Dir, "qmp.sock") + ",server=on,wait=off",
		"-serial", "file:" + filepath.Join(c.Dir, "console.log"),
		"-drive", "file=" + filepath.Join(c.ImageDir, "rootfs.img") + ",format=raw,if=virtio,snapshot=on",
	}
	if c.Payload != "" {
		img := filepath.Join(c.Dir, "payload.img")
		size, err := dirMiB(c.Payload)
		if err != nil {
			return nil, err
		}
		if err := mkfs(ctx, img, "us-payload", c.Payload, size+size/4+16); err != nil {
			return nil, err
		}
		args = append(args, "-drive", "file="+img+",format=raw,if=virtio,readonly=on")
	} else {
		// An empty payload: the guest waits for both mounts.
		empty := filepath.Join(c.Dir, "empty.img")
		if err := mkfs(ctx, empty, "us-payload", "", 8); err != nil {
			return nil, err
		}
		args = append(args, "-drive", "file="+empty+",format=raw,if=virtio,readonly=on")
	}
	args = append(args, "-drive", "file="+scratch+",format=raw,if=virtio",
		"-chardev", "socket,path="+qga+",server=on,wait=off,id=qga0",
		"-device", "virtio-serial", "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0")
	if c.Tap != "" {
		args = append(args, "-netdev", "tap,id=n0,ifname="+c.Tap+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,mac="+c.MAC)
	} else {
		args = append(args, "-nic", "none")
	}
	cmd := exec.Command(qemu, args...)
	qlog, err := os.Create(filepath.Join(c.Dir, "qemu.log"))
	if err != nil {
		return nil, err
	}
	defer qlog.Close()
	cmd.Stdout, cmd.Stderr = qlog, qlog
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	v := &VM{dir: c.Dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		v.waitErr = cmd.Wait()
		close(v.done)
	}()
	tb.Cleanup(func() {
		if tb.Failed() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			tb.Logf("guest as seen from outside:\n%s", v.Diagnose(dctx))
			cancel()
		}
		v.kill()
		if tb.Failed() {
			b, _ := os.ReadFile(filepath.Join(c.Dir, "console.log"))
			q, _ := os.ReadFile(filepath.Join(c.Dir, "qemu.log"))
			tb.Logf("guest console (last 6 KiB):\n%s\nqemu:\n%s", tail(b, 6<<10), q)
		}
		if v.conn != nil {
			v.conn.Close()
		}
	})
	if err := v.connect(ctx, qga); err != nil {
		return nil, err
	}
	// The agent starts before the payload and scratch mounts (nofail) are done.
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r, err := v.Run(mctx, "i=0; until mountpoint -q /opt/understory && mountpoint -q /var/lib/understory-out; do i=$((i+1)); [ $i -lt 500 ] || exit 1; sleep 0.2; done")
	if err != nil {
		return nil, fmt.Errorf("waiting for the payload disk: %w", err)
	}
	if r.ExitCode != 0 {
		return nil, fmt.Errorf("payload or scratch disk not mounted in the guest after 100 s: %s", r.Stderr)
	}
	if err := v.prepare(mctx); err != nil {
		return nil, err
	}
	return v, nil
}

// Console returns the guest's serial console so far.
func (v *VM) Console() string {
	b, _ := os.ReadFile(filepath.Join(v.dir, "console.log"))
	return string(b)
}

func (v *VM) kill() {
	select {
	case <-v.done:
		return
	default:
	}
	_ = v.cmd.Process.Kill()
	<-v.done
}

// connect dials the guest agent's socket and waits for the agent to answer a sync.
func (v *VM) connect(ctx context.Context, sock string) error {
	for {
		select {
		case <-v.done:
			return fmt.Errorf("qemu exited before the guest agent answered: %v (console: %s)", v.waitErr, tail([]byte(v.Console()), 2048))
		default:
		}
		if v.conn == nil {
			if c, err := net.Dial("unix", sock); err == nil {
				v.conn, v.rd = c, bufio.NewReader(c)
			}
		}
		if v.conn != nil {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			err := v.sync(sctx)
			cancel()
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the guest agent: %w (console: %s)", ctx.Err(), tail([]byte(v.Console()), 2048))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// sync sends guest-sync with a fresh id and reads replies until it comes back: the
// agent's answers to anything sent before (a timed-out exchange) are skipped.
func (v *VM) sync(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seq++
	id := v.seq
	if err := v.send(ctx, "guest-sync", map[string]any{"id": id}); err != nil {
		return err
	}
	for {
		var r struct {
			Return json.RawMessage `json:"return"`
		}
		err := v.recv(ctx, &r)
		if errors.Is(err, errAgent) {
			continue // the answer to an earlier, abandoned request
		}
		if err != nil {
			return err
		}
		if n, err := strconv.Atoi(string(r.Return)); err == nil && n == id {
			return nil
		}
	}
}

func (v *VM) send(ctx context.Context, cmd string, args any) error {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = v.conn.SetWriteDeadline(d)
	} else {
		_ = v.conn.SetWriteDeadline(time.Time{})
	}
	_, err = v.conn.Write(b)
	return err
}

// recv reads one JSON reply (a line) into out, failing on the agent's error reply.
func (v *VM) recv(ctx context.Context, out any) error {
	if d, ok := ctx.Deadline(); ok {
		_ = v.conn.SetReadDeadline(d)
	} else {
		_ = v.conn.SetReadDeadline(time.Time{})
	}
	for {
		line, err := v.rd.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("reading the guest agent: %w", err)
		}
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var e struct {
			Error *struct {
				Class, Desc string
			} `json:"error"`
		}
		if json.Unmarshal(line, &e) == nil && e.Error != nil {
			return fmt.Errorf("%w: %s: %s", errAgent, e.Error.Class, e.Error.Desc)
		}
		return json.Unmarshal(line, out)
	}
}

// call is one request and its reply.
func (v *VM) call(ctx context.Context, cmd string, args, out any) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.send(ctx, cmd, args); err != nil {
		return err
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := v.recv(ctx, &r); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(r.Return, out)
}

// Result is a finished guest command.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
}

// Run runs a shell script in the guest as root (/bin/sh -c) and waits for it to end
// or ctx to expire. A non-zero exit is not an error: the caller reads ExitCode.
func (v *VM) Run(ctx context.Context, script string) (Result, error) {
	var started struct {
		PID int `json:"pid"`
	}
	if err := v.call(ctx, "guest-exec", map[string]any{
		"path": "/bin/sh", "arg": []string{"-c", script}, "capture-output": true,
	}, &started); err != nil {
		return Result{}, fmt.Errorf("guest-exec: %w", err)
	}
	for {
		var st struct {
			Exited   bool   `json:"exited"`
			ExitCode int    `json:"exitcode"`
			Signal   int    `json:"signal"`
			OutData  string `json:"out-data"`
			ErrData  string `json:"err-data"`
		}
		if err := v.call(ctx, "guest-exec-status", map[string]any{"pid": started.PID}, &st); err != nil {
			return Result{}, fmt.Errorf("guest-exec-status: %w", err)
		}
		if st.Exited {
			out, _ := base64.StdEncoding.DecodeString(st.OutData)
			errb, _ := base64.StdEncoding.DecodeString(st.ErrData)
			code := st.ExitCode
			if st.Signal != 0 {
				code = 128 + st.Signal
			}
			return Result{Stdout: string(out), Stderr: string(errb), ExitCode: code}, nil
		}
		select {
		case <-ctx.Done():
			return Result{}, fmt.Errorf("guest command %q: %w", firstLine(script), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// MustRun runs script and fails tb unless it exits 0; it returns stdout.
func (v *VM) MustRun(ctx context.Context, tb testing.TB, script string) string {
	tb.Helper()
	r, err := v.Run(ctx, script)
	if err != nil {
		tb.Fatal(err)
	}
	if r.ExitCode != 0 {
		tb.Fatalf("guest: %q exited %d\nstdout:\n%s\nstderr:\n%s", firstLine(script), r.ExitCode, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// mkfs writes an ext4 image of sizeMiB holding dir's files ("": empty).
func mkfs(ctx context.Context, img, label, dir string, sizeMiB int) error {
	args := []string{"-q", "-F", "-L", label, "-E", "root_owner=0:0"}
	if dir != "" {
		args = append(args, "-d", dir)
	}
	args = append(args, img, strconv.Itoa(sizeMiB)+"M")
	if b, err := exec.CommandContext(ctx, "mkfs.ext4", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", img, err, b)
	}
	return nil
}

// dirMiB is the size of dir's regular files in MiB, rounded up.
func dirMiB(dir string) (int, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size() + 4096
		}
		return nil
	})
	return int((n + 1<<20 - 1) >> 20), err
}
