// Command kueue-quota is the Kueue quota follower (package kueuequota): it keeps the
// nominalQuota of the ClusterQueues labelled understory.io/quota-follower=true
// following the batch capacity the agents publish on the Nodes, and deactivates
// admitted Workloads through Kueue when the quotas fall below what is admitted.
//
// Replicas elect a leader (-leader-elect, on by default: the Lease
// understory-kueue-quota in $POD_NAMESPACE, identity $POD_NAME): only the leader
// runs passes; a standby keeps its Node informer synced (so /readyz is 200 on
// both) and takes over when the leader's Lease expires (about 17 s after a
// killed leader's last renewal; within 2 s of a graceful stop, which releases
// it). A leader that cannot renew its Lease exits with status 1, and its
// Deployment restarts it as a standby. manifests/components/kueue runs two
// replicas; docs/kueue.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/understory/understory/kueuequota"
)

// defaultLeaseNamespace is the Lease's namespace when $POD_NAMESPACE is unset
// (the install's namespace).
const defaultLeaseNamespace = "understory-system"

type options struct {
	listen     string
	kubeconfig string
	master     string
	cfg        kueuequota.Config
	// leaderElect runs passes only while holding the Lease of leader.
	leaderElect bool
	leader      kueuequota.LeaderConfig
}

// parseFlags parses args; getenv and hostname are the environment's
// (POD_NAMESPACE and POD_NAME, from the downward API, or the host name: the
// Lease's namespace and this replica's identity).
func parseFlags(args []string, out io.Writer, getenv func(string) string, hostname func() (string, error)) (options, error) {
	ns, id := getenv("POD_NAMESPACE"), getenv("POD_NAME")
	if ns == "" {
		ns = defaultLeaseNamespace
	}
	if id == "" {
		if h, err := hostname(); err == nil {
			id = h
		}
	}
	o := options{cfg: kueuequota.DefaultConfig(), leader: kueuequota.DefaultLeaderConfig(ns, id)}
	l := &o.leader
	fs := flag.NewFlagSet("kueue-quota", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.listen, "listen", ":9464", "HTTP listen address (/metrics, /healthz, /readyz)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig path; empty: in-cluster config")
	fs.StringVar(&o.master, "master", "", "API server URL, overrides the kubeconfig's")
	resources := strings.Join(o.cfg.Resources, ",")
	fs.StringVar(&resources, "resources", resources, "comma-separated published resources the quotas follow")
	fs.StringVar(&o.cfg.Flavor, "flavor", o.cfg.Flavor, "ResourceFlavor whose nominalQuota is written")
	fs.DurationVar(&o.cfg.Interval, "interval", o.cfg.Interval, "time between passes")
	fs.Float64Var(&o.cfg.Params.RiseFraction, "rise-fraction", o.cfg.Params.RiseFraction,
		"part of the gap to a higher target closed per pass (0 < f <= 1); falls are at once")
	fs.Float64Var(&o.cfg.Params.Deadband, "deadband", o.cfg.Params.Deadband,
		"relative gap below which a rise is not written (0 <= d < 1)")
	fs.Float64Var(&o.cfg.Params.EvictTolerance, "evict-tolerance", o.cfg.Params.EvictTolerance,
		"part of the quotas' sum the cohort's reservations may exceed before admitted Workloads are evicted, and what "+
			"is left over after (0 <= t < 1); the quotas fall at once, so Kueue admits nothing new meanwhile")
	fs.BoolVar(&o.cfg.EvictOverQuota, "evict-over-quota", o.cfg.EvictOverQuota,
		"deactivate admitted Workloads (Kueue evicts and, once reactivated, requeues them) when the cohort's reservations exceed the quotas")
	fs.DurationVar(&o.cfg.EvictAfter, "evict-after", o.cfg.EvictAfter,
		"how long the cohort's reservations must stay over the quotas, on every pass, before a Workload is deactivated; "+
			"then at most one per pass. 0: from the first pass that sees the excess")
	fs.DurationVar(&o.cfg.MetricsMaxAge, "metrics-max-age", o.cfg.MetricsMaxAge,
		"a Node whose agent's node-metrics is older than this (or missing) counts 0; the scheduler extender's -metrics-max-age")
	fs.DurationVar(&o.cfg.MetricsMaxSkew, "metrics-max-skew", o.cfg.MetricsMaxSkew,
		"a Node whose node-metrics is stamped further ahead than this counts 0; the scheduler extender's -metrics-max-skew")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader among replicas (a coordination.k8s.io Lease): only "+
		"the leader runs passes; a standby keeps its Node informer synced and takes over when the Lease expires. A "+
		"leader that cannot renew the Lease exits (status 1). false: run passes at once, as the only replica")
	fs.StringVar(&l.Namespace, "leader-elect-namespace", l.Namespace, "namespace of the leader Lease; its default is $POD_NAMESPACE, else "+
		defaultLeaseNamespace)
	fs.StringVar(&l.Name, "leader-elect-name", l.Name, "name of the leader Lease")
	fs.StringVar(&l.Identity, "leader-elect-identity", l.Identity, "this replica's identity in the Lease, unique among "+
		"the replicas; its default is $POD_NAME, else the host name")
	fs.DurationVar(&l.LeaseDuration, "leader-elect-lease-duration", l.LeaseDuration, "how long a standby waits after "+
		"the leader's last renewal before it takes the Lease (whole seconds)")
	fs.DurationVar(&l.RenewDeadline, "leader-elect-renew-deadline", l.RenewDeadline, "how long the leader tries to "+
		"renew before it gives up and exits; below the lease duration")
	fs.DurationVar(&l.RetryPeriod, "leader-elect-retry-period", l.RetryPeriod, "how often replicas try to take or renew the Lease")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.cfg.Resources = nil
	for r := range strings.SplitSeq(resources, ",") {
		if r = strings.TrimSpace(r); r != "" {
			o.cfg.Resources = append(o.cfg.Resources, r)
		}
	}
	if err := o.cfg.Validate(); err != nil {
		return o, err
	}
	if o.leaderElect {
		if err := o.leader.Validate(); err != nil {
			return o, fmt.Errorf("-leader-elect (set POD_NAMESPACE and POD_NAME, or the -leader-elect-* flags): %w", err)
		}
	}
	return o, nil
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	rc, err := clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kube client config: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kube client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	broadcaster := record.NewBroadcaster()
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: o.cfg.Component})
	f, err := kueuequota.New(client, dyn, o.cfg, reg, recorder, log)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !f.Synced() {
			http.Error(w, "node informer not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.listen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("kueue quota follower started", "listen", ln.Addr().String(), "interval", o.cfg.Interval,
		"resources", o.cfg.Resources, "flavor", o.cfg.Flavor, "leaderElect", o.leaderElect,
		"lease", o.leader.Namespace+"/"+o.leader.Name, "identity", o.leader.Identity)
	var runErr error
	if o.leaderElect {
		runErr = f.RunElected(ctx, o.leader)
	} else {
		runErr = f.Run(ctx)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return errors.Join(runErr, err)
	}
	return runErr
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	o, err := parseFlags(os.Args[1:], os.Stderr, os.Getenv, os.Hostname)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		log.Error("bad flags", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("kueue-quota failed", "err", err)
		os.Exit(1)
	}
}
