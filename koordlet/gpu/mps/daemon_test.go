package mps

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/testenv"
)

// fakeControl emulates nvidia-cuda-mps-control: -d creates the control FIFO and an
// "alive" marker (the daemon) and, where the file shm-marker names a marker, writes
// "control" to /dev/shm/<marker> and leaves a child (a server) that writes "server" to
// /dev/shm/<marker>.server once the file go exists; get_server_list answers while the
// marker exists (server 4242, whose clients and active thread percentage are the files
// clients and percentage next to the pipe directory), quit removes both. Every call is
// appended to $CUDA_MPS_PIPE_DIRECTORY/../calls.
const fakeControl = `#!/bin/sh
dir="$CUDA_MPS_PIPE_DIRECTORY"
calls="$(dirname "$dir")/calls"
if [ "$1" = "-d" ]; then
	echo "-d log=$CUDA_MPS_LOG_DIRECTORY" >>"$calls"
	[ -e "$(dirname "$dir")/fail-start" ] && { echo "cannot start" >&2; exit 1; }
	rm -f "$dir/control"; mkfifo "$dir/control"; : >"$dir/alive"
	root="$(dirname "$dir")"
	if [ -e "$root/shm-marker" ]; then
		marker="/dev/shm/$(cat "$root/shm-marker")"
		echo control >"$marker"
		( i=0; while [ ! -e "$root/go" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
		  echo server >"$marker.server" ) >/dev/null 2>&1 </dev/null &
	fi
	exit 0
fi
read -r cmd
echo "$cmd" >>"$calls"
if [ ! -e "$dir/alive" ]; then echo "Cannot find MPS control daemon process" >&2; exit 1; fi
case "$cmd" in
get_server_list) echo 4242 ;;
"get_client_list 4242") cat "$(dirname "$dir")/clients" 2>/dev/null ;;
"get_active_thread_percentage 4242") cat "$(dirname "$dir")/percentage" 2>/dev/null || exit 1 ;;
quit) rm -f "$dir/alive" "$dir/control" ;;
*) exit 1 ;;
esac
`

type fake struct {
	root, pipe string
	cfg        Config
}

func newFake(t *testing.T, mode Mode) *fake {
	t.Helper()
	root := t.TempDir()
	bin := filepath.Join(root, "nvidia-cuda-mps-control")
	if err := os.WriteFile(bin, []byte(fakeControl), 0o755); err != nil {
		t.Fatal(err)
	}
	f := &fake{root: root, pipe: filepath.Join(root, "pipe")}
	f.cfg = Config{Mode: mode, PipeDirectory: f.pipe, LogDirectory: filepath.Join(root, "log"),
		ShmDirectory: filepath.Join(root, "shm"), ControlBinary: bin, CheckPeriod: metav1.Duration{Duration: 100 * time.Millisecond}}
	return f
}

// daemonRunning starts a daemon as an outsider would (mode find's daemon).
func (f *fake) daemonRunning(t *testing.T) {
	t.Helper()
	if err := os.MkdirAll(f.pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Mode: ModeRun, PipeDirectory: f.pipe, LogDirectory: f.cfg.LogDirectory,
		ShmDirectory: f.cfg.ShmDirectory, ControlBinary: f.cfg.ControlBinary}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// die kills the daemon without its socket (a crash).
func (f *fake) die(t *testing.T) {
	t.Helper()
	if err := os.Remove(filepath.Join(f.pipe, "alive")); err != nil {
		t.Fatal(err)
	}
}

func (f *fake) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.root, "calls"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

func (f *fake) count(t *testing.T, call string) int {
	n := 0
	for _, c := range f.calls(t) {
		if c == call {
			n++
		}
	}
	return n
}

// syncLog collects log output safely across goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// running is a Daemon's Run in a goroutine.
type running struct {
	d    *Daemon
	log  *syncLog
	stop context.CancelFunc
	done chan error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	l := &syncLog{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(l, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, log: l, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

func (r *running) shutdown(t *testing.T) {
	t.Helper()
	r.stop()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run = %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// waitFor polls cond until it holds or 10 s passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, what, cond)
}

func TestFindUsesARunningDaemonAndNeverStopsIt(t *testing.T) {
	t.Parallel()
	needRoot(t)
	f := newFake(t, ModeFind)
	f.daemonRunning(t)
	r := start(t, f.cfg)
	waitFor(t, "ready", r.d.Ready)
	if r.d.PipeDir() != f.pipe {
		t.Fatalf("PipeDir = %q, want %q", r.d.PipeDir(), f.pipe)
	}
	// The daemon dies: not ready, and find does not start one.
	f.die(t)
	waitFor(t, "not ready after the daemon died", func() bool { return !r.d.Ready() })
	r.shutdown(t)
	if n := f.count(t, "-d"); n != 1 { // the test's own start only
		t.Fatalf("find started a daemon: %d -d calls", n)
	}
	if n := f.count(t, "quit"); n != 0 {
		t.Fatalf("find quit a daemon it did not start: %v", f.calls(t))
	}
	if !strings.Contains(r.log.String(), "MPS control daemon not ready") {
		t.Fatalf("the flip to not ready was not logged:\n%s", r.log.String())
	}
}

func TestFindWithoutDaemonIsNotReady(t *testing.T) {
	t.Parallel()
	needRoot(t)
	f := newFake(t, ModeFind)
	// A stale socket from a killed daemon does not count: only an answer does.
	if err := os.MkdirAll(f.pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	f.daemonRunning(t)
	f.die(t)
	d, err := New(f.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.check(context.Background())
	if d.Ready() {
		t.Fatal("ready with a stale socket and no daemon")
	}
	if _, err := d.probe(context.Background()); err == nil || !strings.Contains(err.Error(), "Cannot find MPS") {
		t.Fatalf("probe = %v; want the binary's complaint", err)
	}
	// No socket at all: not ready without running the binary.
	if err := os.Remove(filepath.Join(f.pipe, "control")); err != nil {
		t.Fatal(err)
	}
	before := len(f.calls(t))
	d.check(context.Background())
	if d.Ready() || len(f.calls(t)) != before {
		t.Fatalf("ready %v, calls %v: want not ready without a call", d.Ready(), f.calls(t))
	}
}

func TestRunStartsRestartsAndQuitsItsOwnDaemon(t *testing.T) {
	t.Parallel()
	needRoot(t)
	f := newFake(t, ModeRun)
	r := start(t, f.cfg)
	waitFor(t, "ready", r.d.Ready)
	if n := f.count(t, "-d"); n != 1 {
		t.Fatalf("%d -d calls, want 1: %v", n, f.calls(t))
	}
	if !strings.Contains(strings.Join(f.calls(t), " "), "log="+f.cfg.LogDirectory) {
		t.Fatalf("daemon started without CUDA_MPS_LOG_DIRECTORY: %v", f.calls(t))
	}
	if fi, err := os.Stat(f.cfg.LogDirectory); err != nil || !fi.IsDir() {
		t.Fatalf("log directory not created: %v", err)
	}
	// The daemon dies: the next check starts another one.
	f.die(t)
	waitFor(t, "a second start", func() bool { return f.count(t, "-d") == 2 })
	waitFor(t, "ready again", r.d.Ready)
	r.shutdown(t)
	if n := f.count(t, "quit"); n != 1 {
		t.Fatalf("%d quit calls on shutdown, want 1: %v", n, f.calls(t))
	}
	if r.d.Ready() {
		t.Fatal("ready after shutdown")
	}
	if _, err := os.Stat(filepath.Join(f.pipe, "alive")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the agent's daemon survived shutdown")
	}
}

func TestRunLeavesAForeignDaemonRunning(t *testing.T) {
	t.Parallel()
	needRoot(t)
	f := newFake(t, ModeRun)
	f.daemonRunning(t)
	r := start(t, f.cfg)
	waitFor(t, "ready", r.d.Ready)
	r.shutdown(t)
	if n, q := f.count(t, "-d"), f.count(t, "quit"); n != 1 || q != 0 {
		t.Fatalf("-d %d, quit %d; want the outsider's start only and no quit: %v", n, q, f.calls(t))
	}
	if _, err := os.Stat(filepath.Join(f.pipe, "alive")); err != nil {
		t.Fatal("the foreign daemon was stopped")
	}
}

func TestRunFailingStartIsNotReady(t *testing.T) {
	t.Parallel()
	needRoot(t)
	f := newFake(t, ModeRun)
	if err := os.WriteFile(filepath.Join(f.root, "fail-start"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := start(t, f.cfg)
	waitFor(t, "two start attempts", func() bool { return f.count(t, "-d") >= 2 })
	if r.d.Ready() {
		t.Fatal("ready although the daemon could not start")
	}
	waitFor(t, "the reason logged", func() bool { return strings.Contains(r.log.String(), "-d: exit status 1") })
	// Once it can start, it does.
	if err := os.Remove(filepath.Join(f.root, "fail-start")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", r.d.Ready)
	r.shutdown(t)
	if n := f.count(t, "quit"); n != 1 {
		t.Fatalf("%d quit calls, want 1", n)
	}
}

func TestNewDisabled(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}, nil); !errors.Is(err, ErrDisabled) {
		t.Fatalf("New(disabled) = %v, want ErrDisabled", err)
	}
	if _, err := New(Config{Mode: "on"}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New(mode on) = %v, want ErrInvalidConfig", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	long := "/" + strings.Repeat("p", maxPipeDirectory)
	for _, tc := range []struct {
		name string
		cfg  Config
		bad  string // "" valid; else a word of the message
	}{
		{"defaults", Config{}, ""},
		{"run with absolute binary", Config{Mode: ModeRun, ControlBinary: "/usr/bin/nvidia-cuda-mps-control"}, ""},
		{"device plugin's daemon", Config{Mode: ModeFind, PipeDirectory: "/run/nvidia/mps/nvidia.com/gpu/pipe",
			ShmDirectory: "/run/nvidia/mps/shm"}, ""},
		{"unknown mode", Config{Mode: "on"}, "mode"},
		{"relative pipe", Config{PipeDirectory: "tmp/mps"}, "pipeDirectory"},
		{"unclean pipe", Config{PipeDirectory: "/tmp/../mps"}, "pipeDirectory"},
		{"trailing slash", Config{LogDirectory: "/var/log/mps/"}, "logDirectory"},
		{"root shm", Config{ShmDirectory: "/"}, "shmDirectory"},
		{"comma", Config{PipeDirectory: "/tmp/a,b"}, "pipeDirectory"},
		{"pipe too long", Config{PipeDirectory: long}, "unix socket"},
		{"pipe is shm", Config{PipeDirectory: "/run/mps", ShmDirectory: "/run/mps"}, "differ"},
		{"binary relative path", Config{ControlBinary: "bin/nvidia-cuda-mps-control"}, "controlBinary"},
		{"binary with space", Config{ControlBinary: "nvidia-cuda-mps-control -d"}, "controlBinary"},
		{"period too short", Config{CheckPeriod: metav1.Duration{Duration: time.Millisecond}}, "checkPeriod"},
		{"negative uid", Config{ClientUID: -1}, "clientUID"},
	} {
		err := tc.cfg.Validate()
		if tc.bad == "" {
			if err != nil {
				t.Errorf("%s: Validate = %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.bad) {
			t.Errorf("%s: Validate = %v; want ErrInvalidConfig naming %q", tc.name, err, tc.bad)
		}
	}
	d := Config{}.WithDefaults()
	if d.Mode != ModeDisabled || d.PipeDirectory != DefaultPipeDirectory || d.LogDirectory != DefaultLogDirectory ||
		d.ShmDirectory != DefaultShmDirectory || d.ControlBinary != DefaultControlBinary ||
		d.CheckPeriod.Duration != DefaultCheckPeriod {
		t.Fatalf("WithDefaults = %+v", d)
	}
}

// TestDaemonListsServerClients: while the daemon answers, each check lists its servers
// with their clients and active thread percentage (what confirms a client's cap from
// outside it); a malformed answer keeps the last list and says why.
func TestDaemonListsServerClients(t *testing.T) {
	t.Parallel()
	needRoot(t)
	f := newFake(t, ModeFind)
	f.daemonRunning(t)
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(f.root, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("clients", "100\n200\n")
	write("percentage", "25.0\n")
	// One check asks get_server_list once: its answer is both the liveness probe and
	// the list of servers.
	d, err := New(f.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := f.count(t, cmdServerList)
	d.check(context.Background())
	if n := f.count(t, cmdServerList) - before; n != 1 || d.Servers().Gen != 1 {
		t.Fatalf("one check: %d get_server_list calls, list %+v; want 1 and a list", n, d.Servers())
	}
	r := start(t, f.cfg)
	waitFor(t, "a server list", func() bool { return r.d.Servers().Gen > 0 })
	l := r.d.Servers()
	if len(l.Servers) != 1 || l.Servers[0].PID != 4242 || l.Servers[0].ActiveThreadPercent != 25 ||
		!slices.Equal(l.Servers[0].Clients, []int{100, 200}) || l.Err != "" {
		t.Fatalf("Servers() = %+v", l)
	}
	// The daemon stops answering the percentage: unknown (0), the clients still listed.
	if err := os.Remove(filepath.Join(f.root, "percentage")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a list without the percentage", func() bool {
		l := r.d.Servers()
		return len(l.Servers) == 1 && l.Servers[0].ActiveThreadPercent == 0
	})
	// A malformed client list: the last list is kept, with why.
	write("clients", "100\nnot-a-pid\n")
	waitFor(t, "the error", func() bool { return strings.Contains(r.d.Servers().Err, "not-a-pid") })
	if l := r.d.Servers(); len(l.Servers) != 1 || len(l.Servers[0].Clients) != 2 {
		t.Fatalf("the last list was not kept: %+v", l)
	}
}

func TestParsePIDList(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		out  string
		most int
		want []int
		ok   bool
	}{
		{"empty", "", 4, nil, true},
		{"lines and blanks", "12\n\n 34 \n", 4, []int{12, 34}, true},
		{"zero", "0\n", 4, nil, false},
		{"negative", "-1\n", 4, nil, false},
		{"a word", "Cannot find\n", 4, nil, false},
		{"too many", "1\n2\n3\n", 2, nil, false},
		{"too large", "99999999999\n", 4, nil, false},
		{"too long", strings.Repeat("1\n", 40<<10), 1 << 20, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParsePIDList(tc.out, tc.most)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrMalformedList)) || !slices.Equal(got, tc.want) {
				t.Fatalf("ParsePIDList = %v, %v", got, err)
			}
		})
	}
}
