package gpureal

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// The fakes speak the stand-ins' protocol without a GPU, for a dry run of the
// orchestration (-fake, and the tests): an LS request spins the CPU for -work, a batch
// "matmul" sleeps for -work (a batch that spun would be cut by the agent's CPU policy on
// a small machine, which is not what a dry run checks). Frozen by the agent they stop, as
// the GPU stand-ins' launches do; they measure nothing about a GPU.

// fakeIO is the protocol's plumbing shared by both fakes.
type fakeIO struct {
	out  *json.Encoder
	cmds chan command
	stop atomic.Bool
}

func newFakeIO(in io.Reader, out io.Writer) *fakeIO {
	f := &fakeIO{out: json.NewEncoder(out), cmds: make(chan command, 4)}
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			var c command
			if json.Unmarshal(sc.Bytes(), &c) != nil {
				continue
			}
			if c.Cmd == "stop" {
				f.stop.Store(true)
				continue
			}
			f.cmds <- c
		}
		close(f.cmds)
	}()
	return f
}

// serve says ready, then runs each "run" command through run and sends its result, and
// answers each "mem" command (fakeMem), until "quit" or the end of input; a "stop" ends
// the current run (f.stop).
func (f *fakeIO) serve(run func(c command, res *event)) error {
	env := mpsEnv()
	if err := f.out.Encode(event{Event: "ready", PID: os.Getpid(), Device: "fake (CPU)", Env: env}); err != nil {
		return err
	}
	mem := &fakeMem{}
	mem.limit, _ = memLimitDevice0(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	for c := range f.cmds {
		if c.Cmd == "quit" {
			return nil
		}
		if c.Cmd == "mem" {
			if err := f.out.Encode(event{Event: "mem", Phase: c.Phase, memOpResult: mem.do(c)}); err != nil {
				return err
			}
			continue
		}
		if c.Cmd != "run" {
			continue
		}
		f.stop.Store(false)
		res := event{Event: "result", Phase: c.Phase, Start: c.Start}
		run(c, &res)
		if err := f.out.Encode(res); err != nil {
			return err
		}
	}
	return nil
}

func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

func sleepUntilUnix(t float64) {
	if d := time.Until(time.Unix(0, int64(t*1e9))); d > 0 {
		time.Sleep(d)
	}
}

// runFakeLS is the fake LS: an open loop of spinning requests.
func runFakeLS(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet(fakeLSCmd, flag.ContinueOnError)
	rate := fs.Float64("rate", 100, "requests per second")
	work := fs.Duration("work", 2*time.Millisecond, "CPU time per request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rate <= 0 {
		return fmt.Errorf("-rate %v must be positive", *rate)
	}
	f := newFakeIO(in, out)
	period := 1 / *rate
	return f.serve(func(c command, res *event) {
		if c.Mode == "idle" {
			for (c.End == 0 || unix(time.Now()) < c.End) && !f.stop.Load() {
				time.Sleep(10 * time.Millisecond)
			}
			return
		}
		for i := 0; !f.stop.Load(); i++ {
			sched := c.Start + float64(i)*period
			if c.End != 0 && sched >= c.End {
				break
			}
			sleepUntilUnix(sched)
			spin(*work)
			res.Sched = append(res.Sched, sched-c.Start)
			res.LatMS = append(res.LatMS, (unix(time.Now())-sched)*1e3)
		}
	})
}

// runFakeBatch is the fake batch: sleeping "matmuls", a synchronize every -every.
func runFakeBatch(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet(fakeBatchCmd, flag.ContinueOnError)
	every := fs.Int("every", 8, "matmuls per synchronize")
	work := fs.Duration("work", time.Millisecond, "time per matmul (asleep)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *every <= 0 {
		return fmt.Errorf("-every %d must be positive", *every)
	}
	f := newFakeIO(in, out)
	return f.serve(func(c command, res *event) {
		res.Every = *every
		sleepUntilUnix(c.Start)
		for !f.stop.Load() && (c.End == 0 || unix(time.Now()) < c.End) {
			time.Sleep(time.Duration(*every) * *work)
			res.Syncs = append(res.Syncs, unix(time.Now())-c.Start)
		}
	})
}

// fakeDeviceMiB is the fakes' device memory.
const fakeDeviceMiB = 81920

// fakeMem answers "mem" commands as standin.py's Memory does, on a simulated device of
// fakeDeviceMiB with the process's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for device 0 (limit,
// MiB; 0: none) as its bound. Each fake is its own process and sees only its own
// allocations: it checks the protocol and the driver's verdict, never a GPU.
type fakeMem struct {
	limit, held, grabbed int
}

func (m *fakeMem) do(c command) memOpResult {
	room := func() int {
		most := fakeDeviceMiB
		if m.limit > 0 {
			most = min(most, m.limit)
		}
		return most - m.held - m.grabbed
	}
	// alloc takes mib (0: until refused) in chunks, as the stand-ins do.
	alloc := func(mib int) (got int, oom bool) {
		want, chunk := mib, max(c.ChunkMiB, 1)
		if want <= 0 {
			want = 1 << 20
		}
		for got < want {
			n := min(chunk, want-got)
			if n > room()-got {
				return got, true
			}
			got += n
		}
		return got, false
	}
	r := memOpResult{Op: c.Op}
	switch c.Op {
	case "hold":
		got, oom := alloc(c.MiB)
		m.held += got
		r.OOM = oom
	case "grab":
		got, oom := alloc(c.MiB)
		m.grabbed += got
		r.GotMiB, r.OOM = got, oom
	case "check":
		intact := true
		r.Intact = &intact
		r.GotMiB, r.OOM = alloc(c.MiB)
	case "free":
		m.held, m.grabbed = 0, 0
	}
	if r.OOM {
		r.OOMError = "fake: out of memory"
	}
	r.HeldMiB = m.held
	r.FreeMiB, r.TotalMiB = float64(room()), fakeDeviceMiB
	return r
}

// mpsEnv is the CUDA_MPS_* and NVIDIA_VISIBLE_DEVICES variables the process got (the
// stand-ins report them, so the result shows what NRI injected).
func mpsEnv() map[string]string {
	out := map[string]string{}
	for _, k := range []string{"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
		"CUDA_MPS_CLIENT_PRIORITY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "NVIDIA_VISIBLE_DEVICES",
		"CUDA_VISIBLE_DEVICES"} {
		if v, ok := os.LookupEnv(k); ok {
			out[k] = v
		}
	}
	return out
}
