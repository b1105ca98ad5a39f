package extender

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/understory/understory/contract"
)

// schedulerConfig is the part of kubescheduler.config.k8s.io/v1
// KubeSchedulerConfiguration the test reads (field names as in the API; the
// typed package would pull k8s.io/component-base into the module).
type schedulerConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Extenders  []struct {
		URLPrefix   string `json:"urlPrefix"`
		EnableHTTPS bool   `json:"enableHTTPS"`
		TLSConfig   *struct {
			ServerName string `json:"serverName"`
			CAFile     string `json:"caFile"`
			CertFile   string `json:"certFile"`
			KeyFile    string `json:"keyFile"`
		} `json:"tlsConfig"`
		FilterVerb       string `json:"filterVerb"`
		PrioritizeVerb   string `json:"prioritizeVerb"`
		BindVerb         string `json:"bindVerb"`
		Weight           int64  `json:"weight"`
		NodeCacheCapable bool   `json:"nodeCacheCapable"`
		HTTPTimeout      string `json:"httpTimeout"`
		Ignorable        bool   `json:"ignorable"`
		ManagedResources []struct {
			Name               string `json:"name"`
			IgnoredByScheduler bool   `json:"ignoredByScheduler"`
		} `json:"managedResources"`
	} `json:"extenders"`
}

// TestSchedulerConfigManifest keeps manifests/scheduler/kube-scheduler-config.yaml
// in line with the server: verbs it routes, resources it manages, timeouts it needs.
func TestSchedulerConfigManifest(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../manifests/scheduler/kube-scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg schedulerConfig
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("manifest does not decode: %v", err)
	}
	if cfg.APIVersion != "kubescheduler.config.k8s.io/v1" || cfg.Kind != "KubeSchedulerConfiguration" {
		t.Fatalf("apiVersion %q kind %q", cfg.APIVersion, cfg.Kind)
	}
	if len(cfg.Extenders) != 1 {
		t.Fatalf("want one extender, got %d", len(cfg.Extenders))
	}
	e := cfg.Extenders[0]
	// HTTPS with a client certificate: the extender's -tls-client-ca-file refuses
	// filter, prioritize and bind from callers without one.
	u, err := url.Parse(e.URLPrefix)
	if err != nil || u.Scheme != "https" || !e.EnableHTTPS {
		t.Errorf("urlPrefix %q enableHTTPS %v, want https (%v)", e.URLPrefix, e.EnableHTTPS, err)
	}
	if tc := e.TLSConfig; tc == nil || tc.ServerName != u.Hostname() || tc.CAFile == "" || tc.CertFile == "" || tc.KeyFile == "" {
		t.Errorf("tlsConfig %+v, want serverName %q (the certificate's name), caFile, certFile and keyFile", tc, u.Hostname())
	}
	if !e.NodeCacheCapable || e.Weight <= 0 || e.Ignorable {
		t.Errorf("nodeCacheCapable %v weight %d ignorable %v", e.NodeCacheCapable, e.Weight, e.Ignorable)
	}
	if e.NodeCacheCapable != DefaultConfig().NodeCacheCapable {
		t.Errorf("nodeCacheCapable %v, but the extender defaults to -node-cache-capable=%v", e.NodeCacheCapable,
			DefaultConfig().NodeCacheCapable)
	}
	if d, err := time.ParseDuration(e.HTTPTimeout); err != nil || d <= DefaultConfig().GangBindTimeout {
		t.Errorf("httpTimeout %q must exceed the gang bind timeout %v (%v)", e.HTTPTimeout, DefaultConfig().GangBindTimeout, err)
	}
	s := testServer(t, nil, Deps{})
	h := s.Handler()
	for _, verb := range []string{e.FilterVerb, e.PrioritizeVerb, e.BindVerb} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/"+verb, strings.NewReader("{}")))
		if rec.Code == http.StatusNotFound || verb == "" {
			t.Errorf("verb %q is not served", verb)
		}
	}
	want := map[string]bool{contract.ResourceGPU: false, contract.ResourceGPUMilli: true, contract.ResourceBatchCPU: true, contract.ResourceBatchMemory: true}
	for _, m := range e.ManagedResources {
		ignored, ok := want[m.Name]
		if !ok || ignored != m.IgnoredByScheduler {
			t.Errorf("managed resource %s ignoredByScheduler=%v", m.Name, m.IgnoredByScheduler)
		}
		delete(want, m.Name)
	}
	if len(want) > 0 {
		t.Errorf("managed resources missing: %v", want)
	}
}

// TestDeploymentProbes keeps manifests/scheduler/scheduler-extender.yaml's probes
// on paths the server serves: readiness on /syncz (synced, leader or standby), liveness on /healthz
// (both open to callers without a client certificate, see cmd/scheduler-extender).
func TestDeploymentProbes(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../manifests/scheduler/scheduler-extender.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type probe struct {
		HTTPGet struct {
			Path string `json:"path"`
		} `json:"httpGet"`
	}
	var found bool
	for _, doc := range strings.Split(string(raw), "\n---") {
		var ds struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name           string `json:"name"`
							LivenessProbe  *probe `json:"livenessProbe"`
							ReadinessProbe *probe `json:"readinessProbe"`
						} `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			t.Fatalf("manifest does not decode: %v", err)
		}
		if ds.Kind != "DaemonSet" && ds.Kind != "Deployment" {
			continue
		}
		for _, c := range ds.Spec.Template.Spec.Containers {
			found = true
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/syncz" {
				t.Errorf("container %s: readiness probe %+v, want GET /syncz", c.Name, c.ReadinessProbe)
			}
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("container %s: liveness probe %+v, want GET /healthz", c.Name, c.LivenessProbe)
			}
		}
	}
	if !found {
		t.Fatal("no extender container found")
	}
	h := testServer(t, nil, Deps{}).Handler()
	for _, path := range []string{"/readyz", "/syncz", "/healthz"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("GET %s: %d", path, rec.Code)
		}
	}
}
