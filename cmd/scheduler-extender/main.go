// Command scheduler-extender serves Understory's kube-scheduler HTTP extender:
// GPU- and gang-aware filter, prioritize and bind (see docs/extender.md).
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/scheduler-extender/placement"
)

// Client-side rate limit of the main API client. One bind is one API write, so
// defaultQPS sustains about that many binds per second (kube-scheduler's own
// 50/100 defaults would cap the extender at 50 binds a second); defaultBurst lets a
// large gang's Bindings go out without waiting.
const (
	defaultQPS   = 500
	defaultBurst = 1000
)

// errBadFlag means a flag value is out of range.
var errBadFlag = errors.New("invalid flag value")

// options are the parsed command line.
type options struct {
	listen     string
	kubeconfig string
	master     string
	qps        float64
	burst      int
	noPodGroup bool
	// Leader election: leaderElect runs it with leader (namespace and
	// identity from -leader-elect-namespace / POD_NAMESPACE and POD_NAME).
	leaderElect bool
	leader      extender.LeaderConfig
	// TLS: serving pair (HTTPS when set) and the CA of accepted client certificates.
	certFile     string
	keyFile      string
	clientCAFile string
	cfg          extender.Config
}

func parseFlags(args []string, out io.Writer) (options, error) {
	return parseFlagsEnv(args, out, os.Getenv)
}

// parseFlagsEnv is parseFlags with the environment read through getenv
// (POD_NAMESPACE, POD_NAME: the downward API's, for leader election).
func parseFlagsEnv(args []string, out io.Writer, getenv func(string) string) (options, error) {
	o := options{cfg: extender.DefaultConfig(),
		leader: extender.DefaultLeaderConfig(getenv("POD_NAMESPACE"), getenv("POD_NAME"))}
	l := &o.leader
	l.PodIP, l.PortName = getenv("POD_IP"), "https"
	ownPod := ""
	if getenv("POD_NAMESPACE") != "" && getenv("POD_NAME") != "" {
		ownPod = getenv("POD_NAMESPACE") + "/" + getenv("POD_NAME")
	}
	fs := flag.NewFlagSet("scheduler-extender", flag.ContinueOnError)
	fs.SetOutput(out)
	c := &o.cfg
	fs.StringVar(&o.listen, "listen", ":8888", "listen address (filter, prioritize, bind, healthz, readyz, syncz, metrics, status)")
	fs.StringVar(&o.certFile, "tls-cert-file", "", "serving certificate (PEM): serve HTTPS, re-read when it changes; "+
		"empty: plain HTTP")
	fs.StringVar(&o.keyFile, "tls-private-key-file", "", "serving key (PEM), with -tls-cert-file")
	fs.StringVar(&o.clientCAFile, "tls-client-ca-file", "", "CA bundle (PEM) of client certificates: callers of "+
		"every path but GET /healthz, /readyz, /syncz and /metrics must present one it signed (kube-scheduler's "+
		"extender tlsConfig certFile/keyFile); re-read when it changes. Needs -tls-cert-file")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig path; empty: in-cluster config")
	fs.StringVar(&o.master, "master", "", "API server URL, overrides the kubeconfig's")
	fs.Float64Var(&o.qps, "kube-api-qps", defaultQPS, "client-side QPS limit to the API server; one bound pod is one "+
		"write (its Binding), so this caps binds per second. kube-scheduler defaults to 50 but is run far higher when "+
		"tuned for throughput (its scheduler_perf benchmark uses 5000); API priority and fairness still protects the API server")
	fs.IntVar(&o.burst, "kube-api-burst", defaultBurst, "client-side burst to the API server (a gang commit sends its Bindings together)")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "run leader election among replicas (a Lease): only the "+
		"leader serves filter, prioritize and bind and is Ready; a standby keeps its informers synced and takes over "+
		"when the leader is gone. The identity is $POD_NAME")
	fs.StringVar(&l.Namespace, "leader-elect-namespace", l.Namespace, "namespace of the leader Lease (default $POD_NAMESPACE)")
	fs.StringVar(&l.Name, "leader-elect-lease-name", l.Name, "name of the leader Lease")
	fs.StringVar(&l.Identity, "leader-elect-identity", l.Identity, "this replica's identity in the Lease (default $POD_NAME)")
	fs.DurationVar(&l.LeaseDuration, "leader-elect-lease-duration", l.LeaseDuration, "how long a standby waits after "+
		"the leader's last renewal before it takes over (a killed leader is replaced after about this + the retry period)")
	fs.DurationVar(&l.RenewDeadline, "leader-elect-renew-deadline", l.RenewDeadline, "how long the leader tries to "+
		"renew before it stops serving and exits; below the lease duration")
	fs.DurationVar(&l.RetryPeriod, "leader-elect-retry-period", l.RetryPeriod, "how often replicas try to take or renew the lease")
	fs.StringVar(&l.Service, "leader-elect-service", "", "selector-less Service the leader points at itself "+
		"(EndpointSlice <service>-leader: $POD_IP, the -listen port, named -leader-elect-port-name); empty: "+
		"route by readiness (/readyz) instead")
	fs.StringVar(&l.PortName, "leader-elect-port-name", l.PortName, "the Service port's name, for the EndpointSlice")
	fs.DurationVar(&l.CatchUpTimeout, "leader-elect-catch-up-timeout", l.CatchUpTimeout, "how long a new leader may "+
		"take to catch up with the API (every bound pod in its index) before it serves; past it, it gives the lease up")
	fs.StringVar(&ownPod, "leader-elect-pod", ownPod, "this replica's own pod, namespace/name (default "+
		"$POD_NAMESPACE/$POD_NAME): a new leader catches up by writing the annotation "+extender.AnnotationCatchUp+
		" on it and waiting for its informer to deliver that write; empty: by listing every bound pod (seconds at "+
		"100 000 pods)")
	fs.BoolVar(&o.noPodGroup, "no-podgroup", false, "do not watch PodGroups at all (scheduling.x-k8s.io nor Volcano's)")
	fs.BoolVar(&c.VolcanoPodGroups, "volcano-podgroups", c.VolcanoPodGroups, "watch Volcano's scheduling.volcano.sh/v1beta1 PodGroups for the minMember of Volcano gangs")
	fs.StringVar(&c.Policy, "policy", c.Policy, fmt.Sprintf("placement policy, one of %v", placement.PolicyNames()))
	fs.Float64Var(&c.WorkloadCoverage, "workload-coverage", c.WorkloadCoverage, "share of pods the target workload classes cover (fgd, understory); 0: the policy's default (fgd 0.95, understory 0.995)")
	fs.DurationVar(&c.WorkloadRefresh, "workload-refresh", c.WorkloadRefresh, "how often the target workload is rebuilt from the pods")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "seed of the random policy (0: from the clock)")
	fs.BoolVar(&c.NodeCacheCapable, "node-cache-capable", c.NodeCacheCapable, "the scheduler's extender config sets nodeCacheCapable; false: learn nodes from filter bodies (they expire when no longer sent)")
	fs.DurationVar(&c.MetricsMaxAge, "metrics-max-age", c.MetricsMaxAge, "node-metrics annotations older than this count as unknown")
	fs.DurationVar(&c.MetricsMaxSkew, "metrics-max-skew", c.MetricsMaxSkew, "node-metrics annotations stamped further than this in the future count as unknown")
	fs.DurationVar(&c.AssumedTTL, "assumed-ttl", c.AssumedTTL, "how long a filter reservation waits for its bind")
	fs.DurationVar(&c.GangPlanTTL, "gang-plan-ttl", c.GangPlanTTL, "how long a gang plan holds capacity (PodGroup scheduleTimeoutSeconds overrides)")
	fs.IntVar(&c.MaxGangMembers, "max-gang-members", c.MaxGangMembers, "largest gang minMember the extender plans; larger gangs are refused with the reason")
	fs.DurationVar(&c.GangBindTimeout, "gang-bind-timeout", c.GangBindTimeout, "how long a gang member's bind waits for the rest; keep below the scheduler's extender httpTimeout")
	fs.DurationVar(&c.APITimeout, "api-timeout", c.APITimeout, "timeout of each API call (patch, binding, get)")
	fs.DurationVar(&c.Housekeeping, "housekeeping", c.Housekeeping, "period of reservation/plan expiry")
	fs.DurationVar(&c.InformerResync, "informer-resync", c.InformerResync, "informer resync period (0: none)")
	fs.DurationVar(&c.MaxCacheStaleness, "max-cache-staleness", c.MaxCacheStaleness, "refuse binds (503, kube-scheduler "+
		"retries) once the node or pod informer has been out of contact with the API server this long")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "request body limit")
	fs.Int64Var(&c.LargeBodyBytes, "large-body-bytes", c.LargeBodyBytes, "a request body above this size (or of "+
		"unknown size) is large: see -max-large-requests")
	fs.IntVar(&c.MaxLargeRequests, "max-large-requests", c.MaxLargeRequests, "large requests handled at once; more "+
		"get 429 and kube-scheduler retries them")
	fs.Int64Var(&c.PodCacheBytes, "pod-cache-bytes", c.PodCacheBytes, "memory bound of the decoded-pod cache (0: no cache)")
	fs.BoolVar(&c.LockHoldMetric, "lock-hold-metric", c.LockHoldMetric, "export a histogram of the index's write-lock "+
		"holds (understory_extender_index_lock_hold_seconds)")
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", c.ReadHeaderTimeout, "HTTP read header timeout")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", c.ReadTimeout, "HTTP read timeout")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", c.WriteTimeout, "HTTP write timeout (must exceed the gang bind timeout)")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "HTTP idle timeout")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if (o.certFile == "") != (o.keyFile == "") {
		return o, fmt.Errorf("-tls-cert-file and -tls-private-key-file go together: %w", errBadFlag)
	}
	if o.clientCAFile != "" && o.certFile == "" {
		return o, fmt.Errorf("-tls-client-ca-file needs -tls-cert-file (client certificates exist only over TLS): %w",
			errBadFlag)
	}
	if !(o.qps > 0) || o.burst < 1 {
		return o, fmt.Errorf("-kube-api-qps %v must be > 0 and -kube-api-burst %d >= 1: %w", o.qps, o.burst, errBadFlag)
	}
	if o.leaderElect {
		if ownPod != "" {
			ns, name, ok := strings.Cut(ownPod, "/")
			if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				return o, fmt.Errorf("-leader-elect-pod %q must be namespace/name: %w", ownPod, errBadFlag)
			}
			o.leader.Pod = types.NamespacedName{Namespace: ns, Name: name}
		}
		if o.leader.Service != "" {
			_, port, err := net.SplitHostPort(o.listen)
			p, perr := strconv.ParseUint(port, 10, 16)
			if err != nil || perr != nil || p == 0 {
				return o, fmt.Errorf("-leader-elect-service needs a numeric -listen port, not %q: %w", o.listen, errBadFlag)
			}
			o.leader.Port = int32(p)
		}
		if err := o.leader.Validate(); err != nil {
			return o, fmt.Errorf("-leader-elect (set POD_NAMESPACE, POD_NAME and with a Service POD_IP, or the flags): %w", err)
		}
	}
	if c.Seed == 0 {
		c.Seed = time.Now().UnixNano()
	}
	if err := c.Validate(); err != nil {
		return o, err
	}
	return o, nil
}

// clientConfig tunes rc for the main clientset: o's rate limit, and protobuf
// requests and answers (JSON still accepted), as kube-scheduler's own client
// does: smaller and cheaper to encode and decode than JSON on both sides, for
// the pod and node lists and watches as much as for the Bindings. The dynamic
// client (PodGroups: CRDs have no protobuf) sets JSON on its own copy.
func clientConfig(rc *rest.Config, o options) {
	rc.QPS, rc.Burst = float32(o.qps), o.burst
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	rc.UserAgent = extender.EventComponent
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	rc, err := clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	clientConfig(rc, o)
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}
	deps := extender.Deps{Client: client, Logger: log, Registry: prometheus.NewRegistry()}
	if o.leaderElect {
		deps.Leader = &o.leader
	}
	if !o.noPodGroup {
		if deps.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
			return fmt.Errorf("building dynamic client: %w", err)
		}
	}
	srv, err := extender.NewServer(o.cfg, deps)
	if err != nil {
		return err
	}
	tlsConfig, err := serverTLS(o, log, deps.Registry)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	hs := newHTTPServer(o, srv.Handler(), tlsConfig, log)
	errc := make(chan error, 2)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runDone := make(chan struct{})
	go func() { defer close(runDone); errc <- srv.Run(runCtx) }()
	go func() { errc <- serve(hs, ln) }()
	logServing(log, o, ln.Addr().String())
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	if errors.Is(first, extender.ErrLeadershipLost) {
		// Refusing since the lease was lost; exit now, binds in flight
		// included: a standby may already lead. kubelet restarts us as one.
		return first
	}
	// Let binds in flight (gang members may wait up to GangBindTimeout) finish.
	sctx, cancel := context.WithTimeout(context.Background(), o.cfg.GangBindTimeout+2*o.cfg.APITimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		first = errors.Join(first, fmt.Errorf("shutting down http: %w", err))
	}
	// Stop following the cluster; a leader releases its lease now, after the
	// binds in flight, so that the standby takes over at once.
	stop()
	<-runDone
	return first
}

// newHTTPServer wraps h for o: over TLS when tlsConfig is set, and behind the
// client-certificate check when a client CA is.
func newHTTPServer(o options, h http.Handler, tlsConfig *tls.Config, log *slog.Logger) *http.Server {
	if o.clientCAFile != "" {
		h = requireClientCert(h)
	}
	hs := extender.NewHTTPServer(o.listen, h, o.cfg)
	hs.TLSConfig = tlsConfig
	// Handshake failures (a caller that does not trust our CA, a client
	// certificate that does not verify) are logged as warnings, not to stderr raw.
	hs.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	return hs
}

// serve runs hs on ln until it is shut down (nil then).
func serve(hs *http.Server, ln net.Listener) error {
	var err error
	if hs.TLSConfig != nil {
		err = hs.ServeTLS(ln, "", "")
	} else {
		err = hs.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving: %w", err)
}

// logServing says how the extender serves; plain HTTP is a warning: whoever
// reaches the port may call bind.
func logServing(log *slog.Logger, o options, addr string) {
	if o.certFile == "" {
		log.Warn("scheduler extender serving plain HTTP: no -tls-cert-file, so callers are not authenticated "+
			"and traffic is not encrypted; use it only on loopback", "addr", addr, "policy", o.cfg.Policy)
		return
	}
	log.Info("scheduler extender serving HTTPS", "addr", addr, "policy", o.cfg.Policy, "cert", o.certFile,
		"clientCertificates", o.clientCAFile != "")
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
		log.Error("scheduler extender stopped", "err", err)
		cancel()
		os.Exit(1)
	}
}
