// Command koordlet is Understory's node agent. It runs batch pods in the CPU that
// latency-sensitive pods leave idle, and cuts them back the moment the LS pods need it.
//
// Without a cluster it reads static pod manifests (-pod-manifests DIR); in a cluster it
// watches the API server for the pods of -node-name (or $NODE_NAME) and publishes node
// metrics for the scheduler extender.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/understory/understory/koordlet"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/koordlet/gpu/pci"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/koordlet/nri"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/metrics"
)

func main() {
	// Hidden entry: the agent's MPS control daemon (gpu.mps.mode run) starts through the
	// agent's own binary, which gives it the MPS shm directory as /dev/shm.
	if len(os.Args) > 1 && os.Args[1] == mps.ShmStartArg {
		fmt.Fprintln(os.Stderr, "koordlet:", mps.StartWithPrivateShm(os.Args[2:]))
		os.Exit(1)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "koordlet:", err)
		os.Exit(1)
	}
}

func run() error {
	configPath := flag.String("config", "", "YAML configuration file (defaults apply when empty)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (in-cluster config when empty)")
	nodeName := flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	manifests := flag.String("pod-manifests", "", "static pod manifest directory: run without an API server")
	listen := flag.String("listen", "", "address for /metrics, /healthz and /status (overrides the config)")
	cgroupRoot := flag.String("cgroup-root", "", "cgroup filesystem mount (overrides the config)")
	sysRoot := flag.String("sys-root", "/sys", "sysfs mount, where an agent without GPU features looks for NVIDIA GPUs it leaves unmanaged")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	pprof := flag.Bool("pprof", false, "also serve /debug/pprof/ (profiling) on the listen address")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	// Flags outrank the file, at the start and at every reload of it.
	override := func(c config.Config) config.Config {
		if *nodeName != "" {
			c.NodeName = *nodeName
		}
		if *manifests != "" {
			c.StaticPodDir = *manifests
		}
		if *listen != "" {
			c.ListenAddress = *listen
		}
		if *cgroupRoot != "" {
			c.CgroupRoot = *cgroupRoot
		}
		return c
	}
	// Thaw first: a previous run killed while batch was frozen left it so, and
	// whatever fails below (a bad configuration, the API server, NVML) must not keep it
	// frozen. The configuration is read as far as it can be, for where the cgroups are.
	var configData []byte
	var readErr error
	thawCfg := config.Default()
	if *configPath != "" {
		if configData, readErr = os.ReadFile(*configPath); readErr == nil {
			thawCfg = config.Lenient(configData)
		}
	}
	_, thawErr := koordlet.ThawAtStart(context.Background(), override(thawCfg), log) // it logs what it did

	cfg := config.Default()
	if *configPath != "" {
		if readErr != nil {
			return fmt.Errorf("reading config (batch cgroups were thawed first): %w", readErr)
		}
		var err error
		if cfg, err = config.Load(configData); err != nil {
			return fmt.Errorf("config %s: %w (batch cgroups were thawed first; the agent stays off until the configuration is fixed)",
				*configPath, err)
		}
	}
	cfg = override(cfg)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w (batch cgroups were thawed first; the agent stays off until the configuration is fixed)", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("must run as root: the agent writes cgroup files (cpu.cfs_quota_us, cpu.idle, ...)")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The start-up thaw read the same roots as cfg (it read them from the same file,
	// with the same flags): New need not walk the tree again unless it failed.
	deps := koordlet.Deps{Registry: reg, Logger: log, ThawedAtStart: thawErr == nil}

	var runSource, runStatus func(context.Context) error
	var runConditions func(context.Context)
	// nodeEvents records the Node's events (a refused configuration); nil in static
	// mode: the log says it.
	var nodeEvents *nodestatus.NodeEvents
	if cfg.StaticPodDir != "" {
		src := podsource.NewStatic(cfg.StaticPodDir, log)
		deps.Pods, deps.Events, runSource = src, podsource.NewLogSink(log), src.Run
	} else {
		if cfg.NodeName == "" {
			return errors.New("-node-name (or $NODE_NAME) is required without -pod-manifests")
		}
		client, err := kubeClient(*kubeconfig)
		if err != nil {
			return err
		}
		src := podsource.NewKube(client.Pods(), cfg.NodeName, log, 0)
		sink := podsource.NewEventSink(client.Events(), "understory-koordlet", cfg.NodeName)
		defer sink.Shutdown()
		nodeEvents = nodestatus.NewNodeEvents(client.Events(), "understory-koordlet", cfg.NodeName)
		defer nodeEvents.Shutdown()
		deps.Pods, deps.Events, runSource = src, sink, src.Run
		deps.Publisher = nodestatus.NewNodeAnnotator(client.Nodes(), cfg.NodeName)
		status, err := nodestatus.New(client.Nodes(), cfg.NodeName, nodestatus.WithLogger(log))
		if err != nil {
			return err
		}
		deps.BatchResources = status
		deps.Evictions = client
		conds := nodestatus.NewPodConditionWriter(client, log)
		deps.PodConditions = conds
		runConditions = conds.Run
		runStatus = status.Run
	}

	if cfg.GPU.Mode != config.GPUModeOff {
		src, err := gpu.Open(cfg.ProcRoot, log)
		if err != nil {
			// The one line a node without GPUs (or a pure-Go build) prints about them.
			log.Info("GPU features off", "reason", err)
		} else {
			deps.GPU = src
			if cfg.StaticPodDir == "" && cfg.GPU.PodResourcesSocket != "" {
				pr, err := podsource.NewPodResources(cfg.GPU.PodResourcesSocket)
				if err != nil {
					return fmt.Errorf("kubelet PodResources client: %w", err)
				}
				defer pr.Close()
				deps.GPUAlloc = pr
			}
		}
	}
	if err := reportUnmanagedGPUs(cfg, deps.GPU == nil, *sysRoot, reg, nodeEvents, log); err != nil {
		return err
	}
	agent, err := koordlet.New(cfg, deps)
	if err != nil {
		return err
	}
	reloadOpts := config.ReloaderOptions{Path: *configPath, Override: override, Registry: reg,
		Logger: log.With("component", "config-reload")}
	if nodeEvents != nil {
		reloadOpts.Events = nodeEvents
	}
	reloader, err := config.NewReloader(cfg, configData, agent, reloadOpts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.ListenAddress, err)
	}
	handler := agent.Handler(reg)
	if *pprof {
		mux := http.NewServeMux()
		mux.Handle("/", handler)
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		handler = mux
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	log.Info("koordlet started", "listen", ln.Addr().String(), "nri", cfg.NRI.Enabled, "node", cfg.NodeName,
		"static", cfg.StaticPodDir, "period", cfg.Period.Duration)

	errc := make(chan error, 5)
	go func() { errc <- ignoreClosed(srv.Serve(ln)) }()
	go func() { errc <- runSource(ctx) }()
	go func() { errc <- reloader.Run(ctx) }()
	if runConditions != nil {
		go runConditions(ctx)
	}
	if runStatus != nil {
		go func() { errc <- runStatus(ctx) }()
	}
	if cfg.NRI.Enabled {
		// Shared-GPU containers get exactly their devices; on a node without GPU
		// features they are refused ("no GPU inventory on this node"), never given all.
		planner, setup := agent.MPSOptions()
		plugin, err := nri.New(cfg, log, nri.Options{
			Pods: deps.Pods, GPUs: agent, Events: deps.Events, GPU: cfg.GPU.Devices,
			MPS: planner, MPSSetup: setup, Timeslice: agent.TimesliceOptions()})
		if err != nil {
			return err
		}
		go func() { errc <- plugin.Run(ctx, cfg.NRI.Socket) }()
	}
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(ctx) }()

	var firstErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil {
			firstErr = err
			log.Error("component failed; shutting down", "err", err)
		}
	}
	stop()
	if err := <-agentDone; err != nil && firstErr == nil {
		firstErr = err
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	return firstErr
}

// reportUnmanagedGPUs says, in the log, a Warning event on the Node and
// understory_gpu_unmanaged, when an agent without GPU features (GPU mode not off)
// runs on a node with NVIDIA GPUs: the GPU agent's node affinity did not pick the
// node, so its GPUs would go unshared and unguarded without a word.
func reportUnmanagedGPUs(cfg config.Config, gpuOff bool, sysRoot string, reg prometheus.Registerer,
	events *nodestatus.NodeEvents, log *slog.Logger) error {
	var gpus []string
	if gpuOff && cfg.GPU.Mode != config.GPUModeOff {
		var err error
		if gpus, err = pci.NVIDIAGPUs(sysRoot); err != nil {
			log.Warn("cannot look for unmanaged GPUs", "err", err)
		}
	}
	if len(gpus) > 0 {
		msg := fmt.Sprintf("%d NVIDIA GPUs on this node's PCI bus (%s) but this agent has no GPU features: "+
			"no GPU label marks the node, so the GPU agent does not run here and the GPUs are neither shared "+
			"nor guarded. Label the node nvidia.com/gpu.present=true (docs/gpu.md)", len(gpus), strings.Join(gpus, ", "))
		log.Warn("GPUs unmanaged", "gpus", len(gpus), "detail", msg)
		if events != nil {
			events.Warn("GPUsUnmanaged", msg)
		}
	}
	return metrics.RegisterUnmanagedGPUs(reg, len(gpus))
}

func kubeClient(kubeconfig string) (*podsource.CoreClient, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "understory-koordlet"
	return podsource.NewCoreClient(cfg)
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
