package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrBadReview wraps every reason an AdmissionReview body is rejected with HTTP 400.
var ErrBadReview = errors.New("malformed AdmissionReview")

// Config tunes the server. DefaultConfig gives working values.
type Config struct {
	// MaxBodyBytes bounds a request body. An AdmissionReview of a pod carries the
	// object (and on UPDATE the old object too); etcd caps one object at 1.5 MiB.
	MaxBodyBytes int64
	// LookupTimeout bounds the API reads (namespace, PriorityClass) of one request;
	// keep it well below the webhook's timeoutSeconds.
	LookupTimeout time.Duration
	// MaxGangMinMember is the largest gang minimum /validate accepts.
	MaxGangMinMember int
	// GPUDevicesWriters are the user names /validate lets set or change
	// understory.io/gpu-devices (on a pod or in a Binding), understory.io/gang-state and
	// understory.io/extender-catch-up: the scheduler extender's service account. Keep it
	// equal to the policies' variables gpuDevicesWriters and extenderAnnotationWriters.
	GPUDevicesWriters []string
	// GPUShareScheduler, in second-scheduler mode, is the second scheduler's name:
	// /validate then refuses a GPU-share pod that names another scheduler (rule
	// gpu-share-scheduler, the Go form of policy understory-gpu-share-scheduler). "" off.
	GPUShareScheduler string
	// ServeValidate serves /validate (the Go form of the ValidatingAdmissionPolicies),
	// for API servers without ValidatingAdmissionPolicy.
	ServeValidate bool
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:      4 << 20,
		LookupTimeout:     time.Second,
		MaxGangMinMember:  DefaultMaxGangMinMember,
		GPUDevicesWriters: []string{DefaultGPUDevicesWriter},
	}
}

// Validate checks c.
func (c Config) Validate() error {
	if c.MaxBodyBytes < 1<<10 {
		return fmt.Errorf("max body bytes %d must be >= 1024", c.MaxBodyBytes)
	}
	if c.LookupTimeout <= 0 {
		return fmt.Errorf("lookup timeout %v must be > 0", c.LookupTimeout)
	}
	if c.MaxGangMinMember < 1 || c.MaxGangMinMember > 999_999_999 {
		return fmt.Errorf("max gang min member %d must be in 1..999999999", c.MaxGangMinMember)
	}
	if len(c.GPUDevicesWriters) == 0 {
		return errors.New("gpu devices writers: name at least one user (the scheduler extender's service account, " +
			DefaultGPUDevicesWriter + ")")
	}
	for _, w := range c.GPUDevicesWriters {
		if w == "" || strings.TrimSpace(w) != w || strings.ContainsAny(w, ", \t\n") {
			return fmt.Errorf("gpu devices writer %q: must be a user name without spaces or commas", w)
		}
	}
	return nil
}

// rules are the validation rules cfg sets.
func (c Config) rules() Rules {
	// The extender's identity writes all its annotations.
	return Rules{MaxGangMinMember: c.MaxGangMinMember, GPUDevicesWriters: c.GPUDevicesWriters,
		ExtenderAnnotationWriters: c.GPUDevicesWriters, GPUShareScheduler: c.GPUShareScheduler}
}

// Deps are the server's collaborators.
type Deps struct {
	// Mutator decides mutations (required).
	Mutator *Mutator
	// Cluster reads namespace labels for /validate (required with ServeValidate).
	Cluster Cluster
	// Registry receives the metrics and serves /metrics (required).
	Registry *prometheus.Registry
	// Ready reports readiness for /healthz; nil: always ready.
	Ready func() bool
	// Logger; nil: discard.
	Logger *slog.Logger
}

// Metrics is the webhook's metric set.
type Metrics struct {
	// Requests counts AdmissionReviews by operation and result (mutated, unchanged,
	// allowed, denied, bad_request).
	Requests *prometheus.CounterVec
	// Duration observes the handling time by endpoint (mutate, validate).
	Duration *prometheus.HistogramVec
	// Errors counts problems by kind (lookup, unsupported, priority_class_missing,
	// invalid_class, decode, encode).
	Errors *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understory_admission_requests_total",
			Help: "AdmissionReviews handled, by operation and result (mutated, unchanged, allowed, denied, bad_request).",
		}, []string{"operation", "result"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "understory_admission_duration_seconds",
			Help:    "Time to handle one AdmissionReview, by endpoint.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}, []string{"endpoint"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understory_admission_errors_total",
			Help: "Problems by kind; except decode, the pod was admitted (fail open).",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.Requests, m.Duration, m.Errors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering admission metrics: %w", err)
		}
	}
	return m, nil
}

// Server serves the admission webhook.
type Server struct {
	cfg     Config
	deps    Deps
	metrics *Metrics
	log     *slog.Logger
}

// NewServer checks cfg and deps and registers the metrics.
func NewServer(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Mutator == nil || deps.Registry == nil {
		return nil, errors.New("admission server needs a Mutator and a Registry")
	}
	if cfg.ServeValidate && deps.Cluster == nil {
		return nil, errors.New("admission server: /validate needs a Cluster (namespace labels)")
	}
	m, err := NewMetrics(deps.Registry)
	if err != nil {
		return nil, err
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, deps: deps, metrics: m, log: log}, nil
}

// Metrics returns the server's metric set.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Handler serves POST /mutate, POST /validate (with ServeValidate: pods, and Bindings
// for the understory.io/gpu-devices rule), GET /healthz and GET /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /mutate", func(w http.ResponseWriter, r *http.Request) { s.serveReview(w, r, "mutate") })
	if s.cfg.ServeValidate {
		mux.HandleFunc("POST /validate", func(w http.ResponseWriter, r *http.Request) { s.serveReview(w, r, "validate") })
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s.deps.Ready != nil && !s.deps.Ready() {
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.deps.Registry, promhttp.HandlerOpts{}))
	return mux
}

// DecodeReview decodes an admission.k8s.io/v1 AdmissionReview request. Errors wrap
// ErrBadReview and say what is wrong.
func DecodeReview(body []byte) (*admissionv1.AdmissionReview, error) {
	var rev admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &rev); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadReview, err)
	}
	switch {
	case rev.APIVersion != admissionv1.SchemeGroupVersion.String() || rev.Kind != "AdmissionReview":
		return nil, fmt.Errorf("%w: apiVersion/kind %q/%q, want %s/AdmissionReview", ErrBadReview,
			rev.APIVersion, rev.Kind, admissionv1.SchemeGroupVersion)
	case rev.Request == nil:
		return nil, fmt.Errorf("%w: no request", ErrBadReview)
	case rev.Request.UID == "":
		return nil, fmt.Errorf("%w: request.uid is empty", ErrBadReview)
	}
	return &rev, nil
}

// decodePod decodes a pod from raw JSON. A pod is not decoded strictly: a newer API
// server may send fields this version does not know.
func decodePod(raw []byte, what string) (*corev1.Pod, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: request.%s is empty", ErrBadReview, what)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		return nil, fmt.Errorf("%w: request.%s: %w", ErrBadReview, what, err)
	}
	return &pod, nil
}

func (s *Server) serveReview(w http.ResponseWriter, r *http.Request, endpoint string) {
	began := time.Now()
	defer func() { s.metrics.Duration.WithLabelValues(endpoint).Observe(time.Since(began).Seconds()) }()
	bad := func(code int, err error) {
		s.metrics.Requests.WithLabelValues("unknown", "bad_request").Inc()
		s.metrics.Errors.WithLabelValues(ProblemDecode).Inc()
		s.log.Warn("bad admission request", "endpoint", endpoint, "code", code, "err", err)
		http.Error(w, err.Error(), code)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		bad(http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: want application/json",
			r.Header.Get("Content-Type")))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			bad(http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", tooBig.Limit))
			return
		}
		bad(http.StatusBadRequest, fmt.Errorf("reading body: %w", err))
		return
	}
	rev, err := DecodeReview(body)
	if err != nil {
		bad(http.StatusBadRequest, err)
		return
	}
	req := rev.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	op := string(req.Operation)
	if op == "" {
		op = "unknown"
	}
	var result string
	isPod := req.Kind.Group == "" && req.Kind.Kind == "Pod" && req.SubResource == ""
	// A Binding comes as pods/binding, or as the legacy resource "bindings".
	isBinding := req.Kind.Group == "" && req.Kind.Kind == "Binding" &&
		(req.SubResource == "binding" || (req.Resource.Resource == "bindings" && req.SubResource == ""))
	switch {
	case isPod:
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.LookupTimeout)
		defer cancel()
		if endpoint == "mutate" {
			result, err = s.mutate(ctx, req, resp)
		} else {
			result, err = s.validate(ctx, req, resp)
		}
	case isBinding && endpoint == "validate":
		result, err = s.validateBinding(req, resp)
	default:
		// Only a misconfigured webhook sends anything else: admit it untouched.
		result = "unchanged"
		resp.Warnings = []string{fmt.Sprintf("understory admission: %s/%s %s is not a pod; ignored",
			req.Kind.Group, req.Kind.Kind, req.SubResource)}
	}
	if err != nil {
		bad(http.StatusBadRequest, err)
		return
	}
	s.metrics.Requests.WithLabelValues(op, result).Inc()
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: rev.TypeMeta, Response: resp})
	if err != nil {
		s.metrics.Errors.WithLabelValues(ProblemEncode).Inc()
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

func deny(resp *admissionv1.AdmissionResponse, err error) {
	resp.Allowed = false
	resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
		Reason: metav1.StatusReasonForbidden, Message: err.Error()}
}

// mutate fills resp for a /mutate request and returns the result label. Only a
// malformed object is an error (HTTP 400).
func (s *Server) mutate(ctx context.Context, req *admissionv1.AdmissionRequest,
	resp *admissionv1.AdmissionResponse) (string, error) {
	if req.Operation != admissionv1.Create {
		return "unchanged", nil
	}
	pod, err := decodePod(req.Object.Raw, "object")
	if err != nil {
		return "", err
	}
	res, err := s.deps.Mutator.Mutate(ctx, req.Namespace, pod)
	for _, p := range res.Problems {
		s.metrics.Errors.WithLabelValues(p).Inc()
	}
	resp.Warnings = res.Warnings
	logArgs := []any{"namespace", req.Namespace, "pod", podName(req, pod), "class", res.Class, "profile", res.Profile,
		"scheduler", res.SchedulerName}
	if len(res.Problems) > 0 {
		s.log.Warn("pod admitted with problems", append(logArgs, "problems", res.Problems, "warnings", res.Warnings)...)
	}
	if err != nil {
		s.log.Info("pod denied", append(logArgs, "err", err)...)
		deny(resp, err)
		return "denied", nil
	}
	if len(res.Patch) == 0 {
		return "unchanged", nil
	}
	patch, err := json.Marshal(res.Patch)
	if err != nil { // cannot happen for these types; fail open
		s.metrics.Errors.WithLabelValues(ProblemEncode).Inc()
		return "unchanged", nil
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	return "mutated", nil
}

// validate fills resp for a /validate request. A namespace that cannot be read
// denies the pod: validation fails closed.
func (s *Server) validate(ctx context.Context, req *admissionv1.AdmissionRequest,
	resp *admissionv1.AdmissionResponse) (string, error) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return "allowed", nil
	}
	pod, err := decodePod(req.Object.Raw, "object")
	if err != nil {
		return "", err
	}
	var old *corev1.Pod
	if req.Operation == admissionv1.Update {
		if old, err = decodePod(req.OldObject.Raw, "oldObject"); err != nil {
			return "", err
		}
	}
	nsLabels, err := s.deps.Cluster.NamespaceLabels(ctx, req.Namespace)
	if err != nil {
		s.metrics.Errors.WithLabelValues(ProblemLookup).Inc()
		deny(resp, fmt.Errorf("understory admission: reading namespace %q: %w", req.Namespace, err))
		return "denied", nil
	}
	if err := ValidatePod(PodRequest{Operation: req.Operation, Old: old, Pod: pod, NamespaceLabels: nsLabels,
		Username: req.UserInfo.Username}, s.cfg.rules()); err != nil {
		deny(resp, err)
		return "denied", nil
	}
	return "allowed", nil
}

// validateBinding fills resp for a /validate request about a Binding (pods/binding or
// bindings CREATE): the Go form of the policy understory-gpu-devices-binding.
func (s *Server) validateBinding(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) (string, error) {
	if req.Operation != admissionv1.Create {
		return "allowed", nil
	}
	if len(req.Object.Raw) == 0 {
		return "", fmt.Errorf("%w: request.object is empty", ErrBadReview)
	}
	var b corev1.Binding
	if err := json.Unmarshal(req.Object.Raw, &b); err != nil {
		return "", fmt.Errorf("%w: request.object: %w", ErrBadReview, err)
	}
	if err := ValidateBinding(&b, req.UserInfo.Username, s.cfg.rules()); err != nil {
		deny(resp, err)
		return "denied", nil
	}
	return "allowed", nil
}

func podName(req *admissionv1.AdmissionRequest, pod *corev1.Pod) string {
	switch {
	case pod.Name != "":
		return pod.Name
	case pod.GenerateName != "":
		return pod.GenerateName + "*"
	}
	return req.Name
}
