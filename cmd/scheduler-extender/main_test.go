package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	extender "github.com/understory/understory/scheduler-extender"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string // error part; "" for success
		chk  func(options) bool
	}{
		{"defaults", nil, "", func(o options) bool {
			return o.listen == ":8888" && o.cfg.Policy == "understory" && o.cfg.Seed != 0 && o.qps == 500 && o.burst == 1000
		}},
		{"client rate", []string{"-kube-api-qps", "80", "-kube-api-burst", "160"}, "", func(o options) bool { return o.qps == 80 && o.burst == 160 }},
		{"zero qps", []string{"-kube-api-qps", "0"}, "-kube-api-qps 0 must be > 0", nil},
		{"negative qps", []string{"-kube-api-qps", "-1"}, "-kube-api-qps -1 must be > 0", nil},
		{"NaN qps", []string{"-kube-api-qps", "NaN"}, "-kube-api-qps NaN must be > 0", nil},
		{"zero burst", []string{"-kube-api-burst", "0"}, "-kube-api-burst 0 >= 1", nil},
		{"overrides", []string{"-listen", "127.0.0.1:9000", "-policy", "bestfit", "-gang-plan-ttl", "2m",
			"-gang-bind-timeout", "10s", "-metrics-max-age", "30s", "-seed", "7"}, "",
			func(o options) bool {
				return o.listen == "127.0.0.1:9000" && o.cfg.Policy == "bestfit" && o.cfg.GangPlanTTL == 2*time.Minute &&
					o.cfg.GangBindTimeout == 10*time.Second && o.cfg.MetricsMaxAge == 30*time.Second && o.cfg.Seed == 7
			}},
		{"robustness flags", []string{"-node-cache-capable=false", "-metrics-max-skew", "1m", "-max-gang-members", "50",
			"-pod-cache-bytes", "1024", "-volcano-podgroups=false"}, "",
			func(o options) bool {
				return !o.cfg.NodeCacheCapable && o.cfg.MetricsMaxSkew == time.Minute && o.cfg.MaxGangMembers == 50 &&
					o.cfg.PodCacheBytes == 1024 && !o.cfg.VolcanoPodGroups
			}},
		{"robustness defaults", nil, "", func(o options) bool {
			return o.cfg.NodeCacheCapable && o.cfg.MetricsMaxSkew == 10*time.Second && o.cfg.MaxGangMembers == 1000 &&
				o.cfg.PodCacheBytes == 32<<20 && o.cfg.VolcanoPodGroups
		}},
		{"gang cap above the annotation limit", []string{"-max-gang-members", "20000"}, "max gang members", nil},
		{"negative skew", []string{"-metrics-max-skew", "-1s"}, "metrics max skew", nil},
		{"negative pod cache", []string{"-pod-cache-bytes", "-1"}, "pod cache bytes", nil},
		{"unknown policy", []string{"-policy", "x"}, "unknown placement policy", nil},
		{"bind wait longer than write timeout", []string{"-gang-bind-timeout", "1m"}, "write timeout", nil},
		{"stray argument", []string{"extra"}, "unexpected arguments", nil},
		{"bad duration", []string{"-assumed-ttl", "soon"}, "invalid value", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tc.args, io.Discard)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want %q", err, tc.want)
				}
				if strings.HasPrefix(tc.want, "-kube-api-") && !errors.Is(err, errBadFlag) {
					t.Fatalf("err %v does not wrap errBadFlag", err)
				}
				return
			}
			if err != nil || !tc.chk(o) {
				t.Fatalf("got %+v, %v", o, err)
			}
		})
	}
}

func TestClientConfig(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"-kube-api-qps", "123", "-kube-api-burst", "456"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rc := &rest.Config{Host: "https://127.0.0.1:6443"}
	clientConfig(rc, o)
	if rc.QPS != 123 || rc.Burst != 456 {
		t.Errorf("rate %v/%d, want 123/456", rc.QPS, rc.Burst)
	}
	// Requests in protobuf, answers in protobuf or JSON, as kube-scheduler's client.
	if rc.ContentType != "application/vnd.kubernetes.protobuf" ||
		rc.AcceptContentTypes != "application/vnd.kubernetes.protobuf,application/json" {
		t.Errorf("content types %q / accept %q", rc.ContentType, rc.AcceptContentTypes)
	}
	if rc.UserAgent != extender.EventComponent {
		t.Errorf("user agent %q", rc.UserAgent)
	}
	// The PodGroup client built from the same config must stay JSON (CRDs have no protobuf).
	if d := dynamic.ConfigFor(rc); strings.Contains(d.ContentType+d.AcceptContentTypes, "protobuf") {
		t.Errorf("dynamic client would send %q, accept %q", d.ContentType, d.AcceptContentTypes)
	}
	if _, err := kubernetes.NewForConfig(rc); err != nil {
		t.Fatalf("clientset from the tuned config: %v", err)
	}
}

// TestLeaderFlags: -leader-elect takes its namespace, identity and pod IP from
// the downward API's environment, the Service port from -listen, and refuses
// what cannot elect.
func TestLeaderFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{"POD_NAMESPACE": "understory-system", "POD_NAME": "ext-1", "POD_IP": "10.0.0.7"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		ok   bool
		chk  func(options) bool
	}{
		{name: "off by default", env: nil, ok: true, chk: func(o options) bool { return !o.leaderElect }},
		{name: "from the environment", args: []string{"-leader-elect", "-leader-elect-service", "svc", "-listen", ":9443"},
			env: env, ok: true, chk: func(o options) bool {
				l := o.leader
				return o.leaderElect && l.Namespace == "understory-system" && l.Identity == "ext-1" &&
					l.PodIP == "10.0.0.7" && l.Port == 9443 && l.PortName == "https" && l.Service == "svc" &&
					l.LeaseDuration == 8*time.Second && l.RenewDeadline == 5*time.Second && l.RetryPeriod == time.Second &&
					l.Pod == types.NamespacedName{Namespace: "understory-system", Name: "ext-1"}
			}},
		{name: "no own pod without the environment", args: []string{"-leader-elect", "-leader-elect-namespace", "ns",
			"-leader-elect-identity", "me"}, ok: true, chk: func(o options) bool { return o.leader.Pod.Name == "" }},
		{name: "own pod by flag", args: []string{"-leader-elect", "-leader-elect-pod", "a/b"}, env: env, ok: true,
			chk: func(o options) bool { return o.leader.Pod == types.NamespacedName{Namespace: "a", Name: "b"} }},
		{name: "own pod off", args: []string{"-leader-elect", "-leader-elect-pod", ""}, env: env, ok: true,
			chk: func(o options) bool { return o.leader.Pod.Name == "" }},
		{name: "own pod without a namespace", args: []string{"-leader-elect", "-leader-elect-pod", "b"}, env: env},
		{name: "own pod with an empty name", args: []string{"-leader-elect", "-leader-elect-pod", "a/"}, env: env},
		{name: "own pod with two slashes", args: []string{"-leader-elect", "-leader-elect-pod", "a/b/c"}, env: env},
		{name: "no identity", args: []string{"-leader-elect"}, env: map[string]string{"POD_NAMESPACE": "ns"}},
		{name: "flags instead of the environment", args: []string{"-leader-elect", "-leader-elect-namespace", "ns",
			"-leader-elect-identity", "me"}, ok: true, chk: func(o options) bool { return o.leader.Identity == "me" }},
		{name: "service without pod IP", args: []string{"-leader-elect", "-leader-elect-service", "svc"},
			env: map[string]string{"POD_NAMESPACE": "ns", "POD_NAME": "p"}},
		{name: "service without a port", args: []string{"-leader-elect", "-leader-elect-service", "svc", "-listen", "x"}, env: env},
		{name: "renew deadline beyond lease", args: []string{"-leader-elect", "-leader-elect-renew-deadline", "9s"}, env: env},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlagsEnv(tc.args, io.Discard, func(k string) string { return tc.env[k] })
			if !tc.ok {
				if err == nil {
					t.Fatalf("parsed %+v, want an error", o.leader)
				}
				return
			}
			if err != nil || !tc.chk(o) {
				t.Fatalf("got %+v, %v", o.leader, err)
			}
		})
	}
}
