// Command admission serves Understory's pod admission webhook: it moves the cpu and
// memory of batch pods to the node's batch resources (see docs/admission.md).
package main

import (
	"context"
	"crypto/tls"
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/internal/certreload"
	"github.com/understory/understory/metrics"
)

// options are the parsed command line.
type options struct {
	listen          string
	certFile        string
	keyFile         string
	profiles        string
	schedulerName   string
	replaced        []string
	kubeconfig      string
	master          string
	resync          time.Duration
	shutdownTimeout time.Duration
	readTimeout     time.Duration
	cfg             admission.Config
}

func parseFlags(args []string, out io.Writer) (options, error) {
	o := options{cfg: admission.DefaultConfig()}
	fs := flag.NewFlagSet("admission", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.listen, "listen", ":9443", "HTTPS listen address (/mutate, /validate, /healthz, /metrics)")
	fs.StringVar(&o.certFile, "tls-cert-file", "", "serving certificate (PEM); reloaded when it changes")
	fs.StringVar(&o.keyFile, "tls-private-key-file", "", "serving key (PEM); reloaded when it changes")
	fs.StringVar(&o.profiles, "profiles", "", "profiles file (YAML); empty: no profiles, only annotated pods")
	fs.StringVar(&o.schedulerName, "scheduler-name", "",
		"second-scheduler mode: set spec.schedulerName to this on batch pods and pods asking for GPUs, GPU shares "+
			"or batch resources (unless they name a scheduler other than default-scheduler); empty: off "+
			"(manifests/components/second-scheduler sets understory-scheduler)")
	replaced := ""
	fs.StringVar(&replaced, "replace-scheduler", "",
		"comma-separated scheduler names that no longer run (koord-scheduler after a migration from Koordinator): "+
			"pods naming one get default-scheduler instead (then the second scheduler, in its mode)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig path; empty: in-cluster config")
	fs.StringVar(&o.master, "master", "", "API server URL, overrides the kubeconfig's")
	fs.DurationVar(&o.resync, "informer-resync", 0, "namespace/PriorityClass informer resync period (0: none)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long requests in flight may finish")
	fs.DurationVar(&o.readTimeout, "read-timeout", 10*time.Second, "HTTP read timeout")
	fs.Int64Var(&o.cfg.MaxBodyBytes, "max-body-bytes", o.cfg.MaxBodyBytes, "request body limit (larger: HTTP 413)")
	fs.DurationVar(&o.cfg.LookupTimeout, "lookup-timeout", o.cfg.LookupTimeout,
		"timeout of the API reads of one request; keep below the webhook's timeoutSeconds")
	fs.IntVar(&o.cfg.MaxGangMinMember, "max-gang-min-member", o.cfg.MaxGangMinMember, "largest gang minimum /validate accepts")
	fs.BoolVar(&o.cfg.ServeValidate, "serve-validate", false,
		"serve /validate, the Go form of the ValidatingAdmissionPolicy, for API servers without it (< 1.30)")
	writers := strings.Join(o.cfg.GPUDevicesWriters, ",")
	fs.StringVar(&writers, "gpu-devices-writers", writers,
		"comma-separated user names that /validate lets set or change understory.io/gpu-devices "+
			"(the scheduler extender's service account; the policies carry theirs in gpuDevicesWriters)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.cfg.GPUDevicesWriters = nil
	for w := range strings.SplitSeq(writers, ",") {
		o.cfg.GPUDevicesWriters = append(o.cfg.GPUDevicesWriters, strings.TrimSpace(w))
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.certFile == "" || o.keyFile == "" {
		return o, errors.New("-tls-cert-file and -tls-private-key-file are required (the API server calls webhooks over TLS)")
	}
	if err := admission.ValidateSchedulerName(o.schedulerName); err != nil {
		return o, fmt.Errorf("-scheduler-name: %w", err)
	}
	for n := range strings.SplitSeq(replaced, ",") {
		if n = strings.TrimSpace(n); n != "" {
			o.replaced = append(o.replaced, n)
		}
	}
	if _, err := admission.NewMutator(admission.Profiles{}, nil, admission.WithSchedulerName(o.schedulerName),
		admission.WithReplacedSchedulers(o.replaced...)); err != nil {
		return o, fmt.Errorf("-replace-scheduler: %w", err)
	}
	o.cfg.GPUShareScheduler = o.schedulerName
	if o.shutdownTimeout <= 0 || o.readTimeout <= 0 || o.resync < 0 {
		return o, errors.New("-shutdown-timeout and -read-timeout must be > 0, -informer-resync >= 0")
	}
	return o, o.cfg.Validate()
}

func loadProfiles(path string) (admission.Profiles, error) {
	if path == "" {
		return admission.Profiles{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return admission.Profiles{}, fmt.Errorf("reading profiles: %w", err)
	}
	ps, err := admission.ParseProfiles(data)
	if err != nil {
		return admission.Profiles{}, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	profiles, err := loadProfiles(o.profiles)
	if err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	rc.UserAgent = "understory-admission"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}
	cluster := admission.NewClusterCache(client, o.resync)
	mut, err := admission.NewMutator(profiles, cluster, admission.WithSchedulerName(o.schedulerName),
		admission.WithReplacedSchedulers(o.replaced...))
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := admission.NewServer(o.cfg, admission.Deps{
		Mutator: mut, Cluster: cluster, Registry: reg, Ready: cluster.HasSynced, Logger: log,
	})
	if err != nil {
		return err
	}
	certs, err := certreload.New(o.certFile, o.keyFile)
	if err != nil {
		return err
	}
	certs.OnReloadError = func(err error) {
		srv.Metrics().Errors.WithLabelValues("tls_reload").Inc()
		log.Warn("TLS certificate reload failed; serving the previous one", "err", err)
	}
	if err := metrics.RegisterCertExpiry(reg, "webhook", certs.NotAfter); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       o.readTimeout,
		WriteTimeout:      o.readTimeout,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	informerCtx, stopInformers := context.WithCancel(context.Background())
	defer func() { stopInformers(); cluster.Shutdown() }()
	cluster.Start(informerCtx)
	errc := make(chan error, 1)
	go func() {
		if err := hs.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serving: %w", err)
		}
	}()
	log.Info("admission webhook serving", "addr", ln.Addr().String(), "profiles", profiles.Len(),
		"validate", o.cfg.ServeValidate, "schedulerName", o.schedulerName, "replaceSchedulers", o.replaced)
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	// Requests in flight finish; the API server's webhook calls are short (timeoutSeconds).
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		first = errors.Join(first, fmt.Errorf("shutting down http: %w", err))
	}
	return first
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		log.Error("bad flags", "err", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o, log); err != nil {
		log.Error("admission webhook stopped", "err", err)
		cancel()
		os.Exit(1)
	}
}
