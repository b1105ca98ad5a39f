//go:build cgo

package gpureal

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu/gpumock"
	"github.com/understory/understory/koordlet/nri"
	"github.com/understory/understory/koordlet/podsource"
)

// testAgentEnv makes the test binary run as the agent (-agent in the dry run): the
// agent's packages wired as cmd/koordlet wires them (static pods, NRI plugin, GPU
// loop), with go-nvml's mock as the GPU: its GPU 0 runs whatever processes the bench's
// pod cgroups hold, attributed through the real /proc; an LS process's SM utilisation
// is its CPU use (the fake LS spins only while it serves requests, so it reads idle when
// it holds its "context" and sends nothing), a batch process's a constant. It reads the
// driver's config file as bin/koordlet would.
const testAgentEnv = "GPUREAL_TEST_AGENT"

// mockBatchUtil is a running batch process's SM utilisation on the mock, percent.
const mockBatchUtil = 40

func runTestAgent(args []string) int {
	fs := flag.NewFlagSet("test-agent", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "agent config")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := testAgent(*cfgPath); err != nil {
		fmt.Fprintln(os.Stderr, "test agent:", err)
		return 1
	}
	return 0
}

func testAgent(cfgPath string) error {
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	cfg, err := config.Load(data)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	mock := gpumock.New()
	col, err := mock.Collector(cfg.ProcRoot)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	src := podsource.NewStatic(cfg.StaticPodDir, log)
	deps := koordlet.Deps{Registry: reg, Logger: log, Pods: src, Events: podsource.NewLogSink(log), GPU: col}
	agent, err := koordlet.New(cfg, deps)
	if err != nil {
		_ = col.Close()
		return err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: agent.Handler(reg), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	planner, setup := agent.MPSOptions()
	plugin, err := nri.New(cfg, log, nri.Options{Pods: src, GPUs: agent,
		Events: deps.Events, GPU: cfg.GPU.Devices, MPS: planner, MPSSetup: setup})
	if err != nil {
		return err
	}
	h, err := cgroups.Open(cfg.CgroupRoot)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	go func() { errc <- src.Run(ctx) }()
	go func() { errc <- plugin.Run(ctx, cfg.NRI.Socket) }()
	go mirrorPods(ctx, mock, h, strings.Trim(cfg.KubeletCgroupRoot, "/"))
	err = agent.Run(ctx)
	cancel()
	for range 2 {
		if e := <-errc; e != nil && !errors.Is(e, context.Canceled) {
			err = errors.Join(err, e)
		}
	}
	return err
}

// mirrorPods sets the processes of the pod cgroups below base on mock GPU 0, every 50 ms.
func mirrorPods(ctx context.Context, mock *gpumock.Node, h *cgroups.Hierarchy, base string) {
	type sample struct {
		cpu float64
		at  time.Time
	}
	last := map[int]sample{}
	// A process's SM utilisation on the mock is its CPU use (percent of a core since the
	// last pass): a fake stand-in spins for each request or matmul, and, as on a GPU, a
	// frozen process launches no work.
	cpuUtil := func(pid int) uint32 {
		c, err := cpuSeconds("/proc", pid)
		if err != nil {
			return 0
		}
		now := time.Now()
		prev, ok := last[pid]
		last[pid] = sample{c, now}
		if !ok {
			return 0
		}
		return uint32(min(100, 100*(c-prev.cpu)/now.Sub(prev.at).Seconds()))
	}
	for {
		var procs []gpumock.Proc
		var walk func(rel string, depth int)
		walk = func(rel string, depth int) {
			if g, err := h.Load(rel); err == nil {
				pids, _ := g.Procs()
				batch := !strings.Contains(rel, "/burstable/")
				for _, pid := range pids {
					p := gpumock.Proc{PID: uint32(pid), MemUtil: 5, MemUsed: 1 << 30}
					p.SMUtil = cpuUtil(pid)
					if batch {
						// Running, batch reads mockBatchUtil; frozen (no CPU since the
						// last pass), 0.
						p.Batch = true
						if p.SMUtil > 0 {
							p.SMUtil = mockBatchUtil
						}
					}
					procs = append(procs, p)
				}
			}
			if depth > 5 {
				return
			}
			kids, _ := h.ListChildren(rel)
			for _, k := range kids {
				walk(path.Join(rel, k), depth+1)
			}
		}
		walk(base, 0)
		mock.Set(0, procs...)
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}
