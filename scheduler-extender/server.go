package extender

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/metrics"
	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/wire"
)

// EventComponent is the source component of the Events the extender emits.
const EventComponent = "understory-scheduler-extender"

// eventRecorder is the part of record.EventRecorder the extender uses.
type eventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Deps are the extender's collaborators; every field is optional.
type Deps struct {
	// Client lists and watches nodes and pods, patches and binds pods, records
	// events. Nil: no informers (the caller feeds State) and bind fails.
	Client kubernetes.Interface
	// Dynamic watches scheduling.x-k8s.io PodGroups and (Config.VolcanoPodGroups)
	// Volcano's. Nil: PodGroup gangs wait with "PodGroup not found", and Volcano
	// gangs use their members' annotation.
	Dynamic dynamic.Interface
	// State is the index to serve, for a caller that feeds it itself: empty, from
	// NewState with the same Config and clock, for one Server, fed once NewServer
	// returned (the gangs then see its pods). Nil: a new one.
	State *State
	// Recorder receives Events. Nil: built on Client (or none without a Client).
	Recorder eventRecorder
	// Registry receives the metrics and serves /metrics. Nil: a new registry.
	Registry *prometheus.Registry
	// Logger logs; nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// LockHold, when set, observes every hold of the index's write lock in
	// seconds (benchmarks; Config.LockHoldMetric exports a histogram of them).
	LockHold prometheus.Observer
	// Leader, when set, runs leader election among replicas (leader.go): Run
	// competes for the lease once the informers synced, and only the leader,
	// caught up with the API, serves filter, prioritize and bind. Needs Client.
	// Nil: this replica always serves (one replica).
	Leader *LeaderConfig
}

// Server is the kube-scheduler HTTP extender. It serves HTTP: it decodes a
// request and encodes the answer (package wire) around the type whose job it
// is; it wires those types (NewServer) and runs informers and housekeeping.
type Server struct {
	cfg         Config
	state       *State        // the cluster index
	gangs       *gang.Gangs   // gang registry and planner
	res         *reservations // Filter, Prioritize
	binder      *binder       // Bind
	feed        *informers    // nil without a Client
	lead        *leadership   // nil without Deps.Leader: always serving
	contact     *apiContact
	out         *outbox
	client      kubernetes.Interface
	broadcaster record.EventBroadcaster
	registry    *prometheus.Registry
	met         *metrics.Extender
	log         *slog.Logger
	now         func() time.Time
	dec         *wire.Decoder // ExtenderArgs, with the decoded-pod and candidate-list caches
	bufs        sync.Pool     // *bytes.Buffer request bodies
	outs        sync.Pool     // *[]byte responses
	scratches   sync.Pool     // *scratch
	large       chan struct{} // a slot per large request in flight (Config.MaxLargeRequests)
}

// NewServer builds an extender; it serves HTTP through Handler at once and
// follows the cluster once Run is called.
func NewServer(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, client: deps.Client, registry: deps.Registry, log: deps.Logger, now: deps.Now,
		dec:   wire.NewDecoder(cfg.PodCacheBytes),
		large: make(chan struct{}, cfg.MaxLargeRequests)}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.registry == nil {
		s.registry = prometheus.NewRegistry()
	}
	var api podAPI = noAPI{}
	recorder := deps.Recorder
	if s.client != nil {
		api = clientAPI{c: s.client}
		if recorder == nil {
			s.broadcaster = record.NewBroadcaster()
			recorder = s.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent})
		}
	}
	st, err := deps.State, error(nil)
	switch {
	case st == nil:
		st, err = NewState(cfg, s.now)
	case !st.servable(cfg):
		err = fmt.Errorf("Deps.State is not an empty index of this config, free to serve: %w", ErrInvalidConfig)
	}
	if err != nil {
		return nil, err
	}
	s.state, s.out, s.contact = st, st.out, newAPIContact(s.now)
	s.out.setSink(recorder, api, s.client != nil, cfg.APITimeout, s.log)
	s.met, err = metrics.NewExtender(s.registry, stateSource{s})
	if err != nil {
		return nil, err
	}
	st.led.met = s.met
	s.res = &reservations{cfg: cfg, now: s.now, ix: st, led: st.led, sc: st.sc}
	port := gangPort{s.res}
	s.gangs = gang.New(gang.Config{MaxMembers: cfg.MaxGangMembers, PlanTTL: cfg.GangPlanTTL, BindTimeout: cfg.GangBindTimeout},
		port, port, s.out, s.met, s.now)
	st.obs, s.res.gangs, s.res.binds = s.gangs, s.gangs, gang.NewBinds(s.gangs)
	if s.client != nil {
		s.feed = &informers{cfg: cfg, client: s.client, dynamic: deps.Dynamic, ix: st, gangs: s.gangs,
			contact: s.contact, out: s.out, log: s.log}
	}
	if deps.Leader != nil {
		if s.lead, err = newLeadership(*deps.Leader, s.client, s.registry, s.log); err != nil {
			return nil, err
		}
		switch {
		case deps.Leader.Pod.Name == "" || s.feed == nil:
		case !clientfeatures.FeatureGates().Enabled(clientfeatures.InOrderInformers):
			s.log.Warn("client-go's InOrderInformers is off: a new leader lists every bound pod to catch up")
		default:
			s.feed.barrier = newPodBarrier(deps.Leader.Pod)
		}
		s.out.setMuted(true) // a standby writes nothing (becomeLeader unmutes)
	}
	s.binder = &binder{cfg: cfg, api: api, contact: s.contact, ix: st, res: s.res, binds: s.res.binds, out: s.out,
		met: s.met, log: s.log, lead: s.lead}
	var holds []prometheus.Observer
	if deps.LockHold != nil {
		holds = append(holds, deps.LockHold)
	}
	if cfg.LockHoldMetric {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metrics.ExtenderNamespace, Name: "index_lock_hold_seconds",
			Help:    "How long each hold of the index's write lock lasted.",
			Buckets: []float64{1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.5, 1},
		})
		if err := s.registry.Register(h); err != nil {
			return nil, fmt.Errorf("registering the lock hold histogram: %w", err)
		}
		holds = append(holds, h)
	}
	switch len(holds) {
	case 1:
		st.lockHold = holds[0]
	case 2:
		st.lockHold = prometheus.ObserverFunc(func(v float64) { holds[0].Observe(v); holds[1].Observe(v) })
	}
	s.bufs.New = func() any { return new(bytes.Buffer) }
	return s, nil
}

type stateSource struct{ s *Server }

func (w stateSource) ExtenderSnapshot() metrics.ExtenderSnapshot { return snapshotMetrics(w.s) }

// Bind binds a pod (binder.Bind).
func (s *Server) Bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error {
	return s.binder.Bind(ctx, args)
}

// Run follows the cluster (informers for nodes, pods and PodGroups) and runs the
// housekeeping loop until ctx is done. Without a Client it only runs housekeeping.
// With Deps.Leader it competes for the lease once the informers synced, and
// returns ErrLeadershipLost (wrapped) when it lost the lease: exit then.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancelRun := context.WithCancel(ctx) // the informers stop when Run returns, whatever ends it
	defer cancelRun()
	if s.broadcaster != nil {
		s.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.client.CoreV1().Events("")})
		defer s.broadcaster.Shutdown()
	}
	if s.feed != nil {
		defer s.feed.wg.Wait()
		if err := s.feed.start(ctx); err != nil {
			return err
		}
	}
	var lost <-chan error // nil without election: never ready
	if s.lead != nil {
		errc, done := make(chan error, 1), make(chan struct{})
		lctx, cancel := context.WithCancel(ctx)
		defer func() { cancel(); <-done }() // the lease is released before Run returns
		go func() {
			defer close(done)
			if err := s.lead.run(lctx, s); err != nil {
				errc <- err
			}
		}()
		lost = errc
	}
	tick := time.NewTicker(s.cfg.Housekeeping)
	defer tick.Stop()
	lastWorkload := s.now()
	for {
		select {
		case <-ctx.Done():
			s.out.wait()
			return nil
		case err := <-lost:
			cancelRun() // before the deferred wait for the informers
			s.out.wait()
			return err
		case <-tick.C:
			s.Housekeep()
			if now := s.now(); now.Sub(lastWorkload) >= s.cfg.WorkloadRefresh {
				lastWorkload = now
				if err := s.state.RefreshWorkload(); err != nil {
					s.log.Error("refreshing target workload", "err", err)
				}
			}
		}
	}
}

// Housekeep runs one housekeeping pass (Run calls it every
// Config.Housekeeping), under the index's write lock: reservations older than
// AssumedTTL expire, what only request bodies showed is forgotten, expired
// gang plans are released and recorded ones resumed, node metrics are aged.
func (s *Server) Housekeep() {
	ix := s.state
	ix.lock()
	now := s.now()
	n := s.res.expire(now)
	ix.forgetArgsOnly(now)
	s.gangs.ExpirePlans(now)
	s.gangs.ResumePlans()
	ix.refreshAllUsage(now)
	ix.unlock()
	if n > 0 {
		s.met.ReservationsExpired.Add(float64(n))
	}
	s.out.flush()
}

// NewHTTPServer wraps h in an http.Server with cfg's timeouts.
func NewHTTPServer(addr string, h http.Handler, cfg Config) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout: cfg.ReadTimeout, WriteTimeout: cfg.WriteTimeout, IdleTimeout: cfg.IdleTimeout}
}

// Handler serves POST /filter, /prioritize, /bind and GET /healthz, /readyz,
// /syncz, /metrics, /status. Until the informers have synced (Ready), filter,
// prioritize and bind are refused with 503: the index would not know which
// devices are held, and kube-scheduler retries a pod whose extender call failed.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /filter", s.instrument("filter", s.guard(s.handleFilter, refuseFilter)))
	mux.Handle("POST /prioritize", s.instrument("prioritize", s.guard(s.handlePrioritize, refusePrioritize)))
	mux.Handle("POST /bind", s.instrument("bind", s.guard(s.handleBind, refuseBind)))
	mux.Handle("GET /healthz", s.instrument("healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	}))
	mux.Handle("GET /readyz", s.instrument("readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := refusal(s); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, err.Error()+"\n")
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	}))
	// The kubelet's readiness probe with leader election: a synced standby is
	// ready to take over (Deployment rollouts and the PodDisruptionBudget count
	// it), while kube-scheduler reaches only the leader (the EndpointSlice it
	// writes, leader.go). /readyz stays "serving now".
	mux.Handle("GET /syncz", s.instrument("syncz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		err := refusal(s)
		if errors.Is(err, ErrStandby) {
			err = nil
		}
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, err.Error()+"\n")
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	}))
	mux.Handle("GET /status", s.instrument("status", s.handleStatus))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	return mux
}

// Ready reports whether the index is synced with the API server (always true
// without a Client) and, with leader election, this replica leads and has
// caught up: the extender answers filter, prioritize and bind only then.
func (s *Server) Ready() bool { return refusal(s) == nil }

// refusal is why s's filter, prioritize and bind are refused now (nil: served):
// ErrNotSynced, ErrStandby or ErrLeadershipLost.
func refusal(s *Server) error {
	if s.feed != nil && !s.feed.synced.Load() {
		return ErrNotSynced
	}
	if !s.lead.serving() {
		return s.lead.refusal()
	}
	return nil
}

// ErrTooManyLarge means Config.MaxLargeRequests large requests are in flight.
var ErrTooManyLarge = errors.New("too many large requests in flight")

// guard runs h once the server is Ready (503 before) and within the limit of
// concurrent large requests (429 beyond it): kube-scheduler treats any failed
// extender call as a scheduling error and retries the pod with backoff.
func (s *Server) guard(h http.HandlerFunc, refuse func(http.ResponseWriter, int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := refusal(s); err != nil {
			refuse(w, http.StatusServiceUnavailable, fmt.Errorf("extender not ready, retry later: %w", err))
			return
		}
		if r.ContentLength < 0 || r.ContentLength > s.cfg.LargeBodyBytes {
			select {
			case s.large <- struct{}{}:
				defer func() { <-s.large }()
			default:
				refuse(w, http.StatusTooManyRequests, fmt.Errorf("%d requests with bodies over %d bytes in flight, retry later: %w",
					s.cfg.MaxLargeRequests, s.cfg.LargeBodyBytes, ErrTooManyLarge))
				return
			}
		}
		h(w, r)
	}
}

// statusWriter records the status code for metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (s *Server) instrument(verb string, h http.HandlerFunc) http.Handler {
	lat := s.met.Latency.WithLabelValues(verb)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r)
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		lat.Observe(time.Since(start).Seconds())
		s.met.Requests.WithLabelValues(verb, strconv.Itoa(sw.code)).Inc()
	})
}

// readBody reads a size-limited body into a pooled buffer; put it back with release.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (*bytes.Buffer, int, error) {
	buf := s.bufs.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		s.release(buf)
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, http.StatusRequestEntityTooLarge,
				fmt.Errorf("body exceeds %d bytes: %w", s.cfg.MaxBodyBytes, wire.ErrBadRequest)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading body: %w: %w", err, wire.ErrBadRequest)
	}
	return buf, http.StatusOK, nil
}

// maxPooledBuffer keeps huge buffers out of the pool.
const maxPooledBuffer = 4 << 20

func (s *Server) release(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBuffer {
		s.bufs.Put(buf)
	}
}

func writeJSON(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
