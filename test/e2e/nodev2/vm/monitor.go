package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// kallsymsFile is where the guest leaves its kernel text symbols on the scratch disk
// (the guest boots with nokaslr, so they hold for the whole run); Diagnose reads them
// from the host with debugfs, which works when the guest no longer answers.
const kallsymsFile = "kallsyms.txt"

// prepare stops the trace ring buffer that the boot-time sched events (see Start)
// would fill, and writes the guest's text symbols to the scratch disk.
func (v *VM) prepare(ctx context.Context) error {
	r, err := v.Run(ctx, `set -e
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
echo 0 > /sys/kernel/tracing/tracing_on
grep -q sched:sched_switch /sys/kernel/tracing/set_event
grep -E ' [tT] ' /proc/kallsyms > /var/lib/understory-out/`+kallsymsFile+`
sync -f /var/lib/understory-out/`+kallsymsFile)
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("preparing the guest (tracing off, kernel symbols): exit %d: %s", r.ExitCode, r.Stderr)
	}
	return nil
}

// Diagnose says what a guest that stopped answering is doing, from outside it: how
// much CPU each qemu thread used over two seconds (spinning vCPUs or an idle guest),
// whether qemu's monitor answers, and for each vCPU its instruction pointer, whether
// interrupts are on, and the kernel text addresses on its stack, named from the
// guest's symbols. Every part that fails says so; it never fails the test itself.
func (v *VM) Diagnose(ctx context.Context) string {
	var b strings.Builder
	b.WriteString(threadCPU(v.cmd.Process.Pid, 2*time.Second))
	syms := loadSymbols(ctx, filepath.Join(v.dir, "scratch.img"))
	m, err := dialMonitor(ctx, filepath.Join(v.dir, "qmp.sock"))
	if err != nil {
		fmt.Fprintf(&b, "qemu monitor: %v\n", err)
		return b.String()
	}
	defer m.Close()
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := m.call("query-status", nil, &st); err != nil {
		fmt.Fprintf(&b, "query-status: %v\n", err)
	} else {
		fmt.Fprintf(&b, "qemu status %s (running %v)\n", st.Status, st.Running)
	}
	var cpus []struct {
		Index int `json:"cpu-index"`
	}
	if err := m.call("query-cpus-fast", nil, &cpus); err != nil {
		fmt.Fprintf(&b, "query-cpus-fast: %v\n", err)
		return b.String()
	}
	// Two samples a second apart: a vCPU at the same place twice with interrupts off
	// is stuck there.
	for round := 0; round < 2; round++ {
		if round > 0 {
			time.Sleep(time.Second)
		}
		for _, c := range cpus {
			b.WriteString(m.cpuState(c.Index, syms))
		}
	}
	return b.String()
}

// threadCPU lists qemu's threads with their state and CPU use over d.
func threadCPU(pid int, d time.Duration) string {
	read := func() map[string][3]string {
		out := map[string][3]string{}
		dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
		for _, dir := range dirs {
			stat, err := os.ReadFile(filepath.Join(dir, "stat"))
			if err != nil {
				continue
			}
			comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
			// The fields after the command's closing parenthesis: state is the first,
			// utime and stime the 12th and 13th.
			s := string(stat)
			i := strings.LastIndexByte(s, ')')
			if i < 0 {
				continue
			}
			f := strings.Fields(s[i+1:])
			if len(f) < 13 {
				continue
			}
			u, _ := strconv.Atoi(f[11])
			k, _ := strconv.Atoi(f[12])
			out[filepath.Base(dir)] = [3]string{strings.TrimSpace(string(comm)), f[0], strconv.Itoa(u + k)}
		}
		return out
	}
	a := read()
	time.Sleep(d)
	z := read()
	tids := make([]string, 0, len(z))
	for tid := range z {
		tids = append(tids, tid)
	}
	sort.Strings(tids)
	var b strings.Builder
	fmt.Fprintf(&b, "qemu threads (state, CPU over %v):\n", d)
	for _, tid := range tids {
		t0, _ := strconv.Atoi(a[tid][2])
		t1, _ := strconv.Atoi(z[tid][2])
		// Clock ticks are 1/100 s on Linux.
		fmt.Fprintf(&b, "  %s %-16s %s %3.0f%%\n", tid, z[tid][0], z[tid][1], float64(t1-t0)/d.Seconds())
	}
	return b.String()
}

// monitor is a QMP connection.
type monitor struct {
	conn net.Conn
	dec  *json.Decoder
}

func dialMonitor(ctx context.Context, sock string) (*monitor, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	m := &monitor{conn: c, dec: json.NewDecoder(bufio.NewReader(c))}
	var greeting map[string]any
	if err := m.dec.Decode(&greeting); err != nil {
		c.Close()
		return nil, fmt.Errorf("no QMP greeting: %w", err)
	}
	if err := m.call("qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return m, nil
}

func (m *monitor) Close() error { return m.conn.Close() }

// call runs one QMP command, skipping the asynchronous events in between.
func (m *monitor) call(cmd string, args, out any) error {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := m.conn.Write(b); err != nil {
		return err
	}
	for {
		var r struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class, Desc string
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := m.dec.Decode(&r); err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		if r.Event != "" {
			continue
		}
		if r.Error != nil {
			return fmt.Errorf("%s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		if out == nil {
			return nil
		}
		return json.Unmarshal(r.Return, out)
	}
}

// hmp runs a human monitor command on one vCPU.
func (m *monitor) hmp(cpu int, line string) (string, error) {
	var out string
	err := m.call("human-monitor-command", map[string]any{"command-line": line, "cpu-index": cpu}, &out)
	return out, err
}

var (
	regRIP    = regexp.MustCompile(`RIP=([0-9a-f]{16})`)
	regRSP    = regexp.MustCompile(`RSP=([0-9a-f]{16})`)
	regRFL    = regexp.MustCompile(`RFL=([0-9a-f]{8})`)
	stackWord = regexp.MustCompile(`0x(ffffffff[0-9a-f]{8})`)
)

// cpuState is one vCPU's line: where it is, whether it takes interrupts, and the
// kernel text addresses among the top 64 words of its stack (a poor man's backtrace).
func (m *monitor) cpuState(cpu int, syms symbols) string {
	regs, err := m.hmp(cpu, "info registers")
	if err != nil {
		return fmt.Sprintf("  cpu %d: %v\n", cpu, err)
	}
	rip, rsp, rfl := first(regRIP, regs), first(regRSP, regs), first(regRFL, regs)
	irq := "?"
	if f, err := strconv.ParseUint(rfl, 16, 64); err == nil {
		irq = strconv.FormatBool(f&0x200 != 0)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  cpu %d: rip %s %s, interrupts on %s\n", cpu, rip, syms.name(rip), irq)
	if rsp == "" || !strings.HasPrefix(rip, "ffff") {
		return b.String()
	}
	words, err := m.hmp(cpu, "x/64gx 0x"+rsp)
	if err != nil {
		fmt.Fprintf(&b, "    stack: %v\n", err)
		return b.String()
	}
	var frames []string
	for _, w := range stackWord.FindAllStringSubmatch(words, -1) {
		if n := syms.name(w[1]); n != "" {
			frames = append(frames, n)
		}
	}
	if len(frames) > 0 {
		fmt.Fprintf(&b, "    stack: %s\n", strings.Join(frames, " < "))
	}
	return b.String()
}

func first(re *regexp.Regexp, s string) string {
	if m := re.FindStringSubmatch(s); m != nil {
		return m[1]
	}
	return ""
}

// symbols are the guest kernel's text symbols, sorted by address.
type symbols []symbol

type symbol struct {
	addr uint64
	name string
}

// loadSymbols reads the kallsyms the guest left on its scratch disk; nil when there
// are none (the guest died before writing them).
func loadSymbols(ctx context.Context, scratch string) symbols {
	out, err := exec.CommandContext(ctx, "debugfs", "-R", "cat /"+kallsymsFile, scratch).Output()
	if err != nil {
		return nil
	}
	return parseKallsyms(string(out))
}

// parseKallsyms reads /proc/kallsyms lines ("ffffffff81000000 T _stext"); lines that
// are not that are skipped.
func parseKallsyms(s string) symbols {
	var syms symbols
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		syms = append(syms, symbol{a, f[2]})
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	return syms
}

// name is "func+0xoff" for a text address, "" when it is not in the kernel's text
// (or the symbols are unknown). An address more than 64 KiB past the last symbol
// is not text.
func (s symbols) name(hex string) string {
	a, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || len(s) == 0 || a < s[0].addr {
		return ""
	}
	i := sort.Search(len(s), func(i int) bool { return s[i].addr > a }) - 1
	if i == len(s)-1 && a-s[i].addr > 64<<10 {
		return ""
	}
	return fmt.Sprintf("%s+0x%x", s[i].name, a-s[i].addr)
}
