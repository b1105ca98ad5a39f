package extenderharness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/internal/controlplane"
	extender "github.com/understory/understory/scheduler-extender"
)

// Verbs the spy counts (the paths of manifests/scheduler/kube-scheduler-config.yaml).
const (
	VerbFilter     = "filter"
	VerbPrioritize = "prioritize"
	VerbBind       = "bind"
)

// maxSpyBody bounds what the spy reads of a body it decodes (the extender
// applies its own, smaller limit afterwards).
const maxSpyBody = 64 << 20

// Options tune Start. The zero value is a working default.
type Options struct {
	// Config is the extender's configuration; nil: extender.DefaultConfig().
	Config *extender.Config
	// TrackPods records the calls per pod (PodCalls). It decodes every body.
	TrackPods bool
	// SyncTimeout bounds the wait for the informer caches; default 60 s.
	SyncTimeout time.Duration
	// Protobuf gives the extender a clientset speaking protobuf (as
	// kube-scheduler does) instead of the control plane's JSON admin client;
	// PodGroups stay JSON (CRDs have no protobuf).
	Protobuf bool
	// RESTConfig, when set, is what the extender's clients (clientset and
	// dynamic) are built from instead of the control plane's admin clients:
	// e.g. a fault-injecting proxy in front of the API server.
	RESTConfig *rest.Config
}

// Calls counts the extender's filter, prioritize and bind requests.
type Calls struct {
	Filter, Prioritize, Bind int64
}

// Total is the sum over the verbs.
func (c Calls) Total() int64 { return c.Filter + c.Prioritize + c.Bind }

// PodCalls is what the spy saw of one pod (Options.TrackPods).
type PodCalls struct {
	Filter, Prioritize, Bind int
	// BindNode is the node of the last bind request.
	BindNode string
	// FirstBind and LastBind are when bind requests for the pod arrived.
	FirstBind, LastBind time.Time
}

// Extender is a running in-process Understory extender.
type Extender struct {
	srv   *extender.Server
	reg   *prometheus.Registry
	inner http.Handler
	hs    *httptest.Server

	track                    bool
	filter, prioritize, bind atomic.Int64
	mu                       sync.Mutex
	pods                     map[string]*PodCalls // by namespace/name

	cancel   context.CancelFunc
	runErr   chan error
	stopOnce sync.Once
	stopErr  error
}

// Start runs the extender with cp's admin clientset and dynamic client,
// serves it on loopback and waits until its informer caches are synced. ctx
// bounds that wait only; the extender lives until Stop or the end of the
// test.
func Start(ctx context.Context, tb testing.TB, cp *controlplane.ControlPlane, opts Options) *Extender {
	tb.Helper()
	cfg := extender.DefaultConfig()
	if opts.Config != nil {
		cfg = *opts.Config
	}
	if opts.SyncTimeout <= 0 {
		opts.SyncTimeout = 60 * time.Second
	}
	logPath := filepath.Join(tb.TempDir(), "extender.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		tb.Fatalf("extender: creating log: %v", err)
	}
	tb.Cleanup(func() {
		logFile.Close()
		if tb.Failed() {
			tb.Logf("extender log %s, last lines:\n%s", logPath, controlplane.TailFile(logPath, 40))
		}
	})
	client, dyn := cp.Client(), cp.Dynamic()
	if opts.RESTConfig != nil {
		if client, err = kubernetes.NewForConfig(opts.RESTConfig); err != nil {
			tb.Fatalf("extender: clientset: %v", err)
		}
		if dyn, err = dynamic.NewForConfig(opts.RESTConfig); err != nil {
			tb.Fatalf("extender: dynamic client: %v", err)
		}
	}
	if opts.Protobuf {
		rc := cp.RESTConfig()
		if opts.RESTConfig != nil {
			rc = rest.CopyConfig(opts.RESTConfig)
		}
		rc.ContentType = runtime.ContentTypeProtobuf
		rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			tb.Fatalf("extender: protobuf clientset: %v", err)
		}
	}
	e := &Extender{reg: prometheus.NewRegistry(), track: opts.TrackPods, pods: map[string]*PodCalls{}, runErr: make(chan error, 1)}
	e.srv, err = extender.NewServer(cfg, extender.Deps{
		Client:   client,
		Dynamic:  dyn,
		Registry: e.reg,
		Logger:   slog.New(slog.NewTextHandler(logFile, nil)),
	})
	if err != nil {
		tb.Fatalf("extender: %v", err)
	}
	e.inner = e.srv.Handler()
	runCtx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.runErr <- e.srv.Run(runCtx) }()
	e.hs = httptest.NewServer(e)
	tb.Cleanup(func() {
		if err := e.Stop(); err != nil {
			tb.Errorf("extender: %v", err)
		}
	})
	if err := e.waitSynced(ctx, opts.SyncTimeout); err != nil {
		tb.Fatalf("extender: %v", err)
	}
	return e
}

// errStopped means the extender's Run returned before its caches synced.
var errStopped = errors.New("extender stopped before its caches synced")

func (e *Extender) waitSynced(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !e.srv.Status().Synced {
		select {
		case err := <-e.runErr:
			e.runErr <- err // for Stop
			if err == nil {
				return errStopped
			}
			return errors.Join(errStopped, fmt.Errorf("run: %w", err))
		case <-ctx.Done():
			return fmt.Errorf("waiting for informer sync: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Stop closes the HTTP server (waiting for requests in flight) and stops the
// informers. It returns Run's error, if any. Safe to call more than once.
func (e *Extender) Stop() error {
	e.stopOnce.Do(func() {
		e.hs.Close()
		e.cancel()
		select {
		case err := <-e.runErr:
			e.stopErr = err
		case <-time.After(30 * time.Second):
			e.stopErr = errors.New("extender Run did not return within 30s of cancel")
		}
	})
	return e.stopErr
}

// URL is the extender's loopback http URL (the urlPrefix for kube-scheduler).
func (e *Extender) URL() string { return e.hs.URL }

// Server is the extender under test (Status, State).
func (e *Extender) Server() *extender.Server { return e.srv }

// Calls returns the requests answered (or being answered) per verb.
func (e *Extender) Calls() Calls {
	return Calls{Filter: e.filter.Load(), Prioritize: e.prioritize.Load(), Bind: e.bind.Load()}
}

// PodCalls returns what the spy saw of pod namespace/name (Options.TrackPods).
func (e *Extender) PodCalls(namespace, name string) PodCalls {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.pods[namespace+"/"+name]; p != nil {
		return *p
	}
	return PodCalls{}
}

// SeenPods lists every pod (namespace/name) the spy saw a request for.
func (e *Extender) SeenPods() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.pods))
	for k := range e.pods {
		out = append(out, k)
	}
	return out
}

// ServeHTTP counts the request and hands it to the extender.
func (e *Extender) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	verb := ""
	if r.Method == http.MethodPost {
		switch r.URL.Path {
		case "/" + VerbFilter:
			verb = VerbFilter
			e.filter.Add(1)
		case "/" + VerbPrioritize:
			verb = VerbPrioritize
			e.prioritize.Add(1)
		case "/" + VerbBind:
			verb = VerbBind
			e.bind.Add(1)
		}
	}
	if e.track && verb != "" {
		arrived := time.Now()
		body, err := io.ReadAll(io.LimitReader(r.Body, maxSpyBody))
		if err != nil {
			http.Error(w, "spy: reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.record(verb, body, arrived)
	}
	e.inner.ServeHTTP(w, r)
}

// podOnly is the part of ExtenderArgs the spy reads.
type podOnly struct {
	Pod *struct {
		Metadata struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"metadata"`
	} `json:"pod"`
}

// record notes a request; bodies it cannot decode are left to the extender to refuse.
func (e *Extender) record(verb string, body []byte, at time.Time) {
	var key, node string
	switch verb {
	case VerbBind:
		var a extenderv1.ExtenderBindingArgs
		if json.Unmarshal(body, &a) != nil || a.PodName == "" {
			return
		}
		key, node = a.PodNamespace+"/"+a.PodName, a.Node
	default:
		var a podOnly
		if json.Unmarshal(body, &a) != nil || a.Pod == nil || a.Pod.Metadata.Name == "" {
			return
		}
		key = a.Pod.Metadata.Namespace + "/" + a.Pod.Metadata.Name
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.pods[key]
	if p == nil {
		p = &PodCalls{}
		e.pods[key] = p
	}
	switch verb {
	case VerbFilter:
		p.Filter++
	case VerbPrioritize:
		p.Prioritize++
	case VerbBind:
		p.Bind++
		p.BindNode = node
		if p.FirstBind.IsZero() {
			p.FirstBind = at
		}
		p.LastBind = at
	}
}

// Metric sums the samples of the extender's metric family name (e.g.
// "understory_extender_binds_total") whose labels include every pair of
// labels ("result", "bound", ...). Counters, gauges and untyped metrics
// count; a family not exported yet sums to 0.
func (e *Extender) Metric(name string, labels ...string) (float64, error) {
	if len(labels)%2 != 0 {
		return 0, fmt.Errorf("labels %q: want name/value pairs: %w", labels, ErrBadArgument)
	}
	fams, err := e.reg.Gather()
	if err != nil {
		return 0, fmt.Errorf("gathering extender metrics: %w", err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Untyped != nil:
				sum += m.Untyped.GetValue()
			}
		}
	}
	return sum, nil
}

// ErrBadArgument marks a misuse of the harness.
var ErrBadArgument = errors.New("bad harness argument")
