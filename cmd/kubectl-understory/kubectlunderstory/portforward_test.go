package kubectlunderstory

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Where a NetworkPolicy (Calico, Cilium) refuses the API server's pod proxy, the
// plugin reads the agent's /status through port-forward instead (--via auto), or only
// there (--via port-forward); --via proxy never forwards. A refused port-forward
// names its RBAC verb.
func TestNodeViaPortForward(t *testing.T) {
	t.Parallel()
	blocked := apierrors.NewServiceUnavailable("dial tcp 10.0.0.5:9316: i/o timeout")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/portforward"}, "understory-koordlet-abcde",
		errors.New("user jane cannot create pods/portforward"))
	for _, tc := range []struct {
		name       string
		via        Via
		proxyErr   error
		forwardErr error
		forwards   int32
		want       error
		contains   string
	}{
		{name: "proxy works", via: ViaAuto, forwards: 0},
		{name: "proxy blocked: port-forward", via: ViaAuto, proxyErr: blocked, forwards: 1},
		{name: "port-forward only", via: ViaPortForward, proxyErr: errors.New("the proxy must not be asked"), forwards: 1},
		{name: "proxy only", via: ViaProxy, proxyErr: blocked, forwards: 0, want: ErrAgentUnreachable, contains: "NetworkPolicy"},
		{name: "both fail", via: ViaAuto, proxyErr: blocked, forwardErr: errors.New("connection refused"), forwards: 1,
			want: ErrAgentUnreachable, contains: "connection refused"},
		{name: "port-forward forbidden", via: ViaPortForward, forwardErr: forbidden, forwards: 1, want: ErrForbidden,
			contains: `verb "create" on "pods/portforward"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status := agentStatusJSON(t, false)
			c := cluster(t, status, tc.proxyErr, []runtime.Object{batchNode("node-a", 1800, 16<<30), agentPodObj("node-a")})
			var calls atomic.Int32
			c.opts.Via = tc.via
			c.opts.Forward = func(_ context.Context, ns, pod string, port int32, path string) ([]byte, error) {
				calls.Add(1)
				if ns != DefaultAgentNamespace || !strings.HasPrefix(pod, "understory-koordlet") || port != 9316 || path != "/status" {
					return nil, errors.New("unexpected forward " + ns + "/" + pod + path)
				}
				return status, tc.forwardErr
			}
			var out bytes.Buffer
			err := c.Node(t.Context(), "node-a", &out, FormatTable)
			if got := calls.Load(); got != tc.forwards {
				t.Errorf("%d port-forwards, want %d", got, tc.forwards)
			}
			if tc.want == nil {
				if err != nil || !strings.Contains(out.String(), "Batch CPU budget") {
					t.Fatalf("error %v, output:\n%s", err, out.String())
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("error %v, want %v containing %q", err, tc.want, tc.contains)
			}
		})
	}
}

func TestParseVia(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Via{"": ViaAuto, "auto": ViaAuto, "proxy": ViaProxy, "port-forward": ViaPortForward} {
		if got, err := ParseVia(in); err != nil || got != want {
			t.Errorf("ParseVia(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseVia("ssh"); !errors.Is(err, ErrUsage) {
		t.Errorf("ParseVia(ssh): %v", err)
	}
}

// `why` reads the cluster's pods in pages of listPageSize, as kubectl does, never in
// one response of every pod.
func TestWhyListsPodsInPages(t *testing.T) {
	t.Parallel()
	pending := batchPod("jobs", "etl", "", 400, 1<<30)
	c := cluster(t, nil, nil, []runtime.Object{batchNode("node-a", 1800, 16<<30), pending,
		batchPod("jobs", "other", "node-a", 400, 1<<30)})
	var limits []int64
	var mu sync.Mutex
	c.kube.(*fake.Clientset).PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		limits = append(limits, a.(k8stesting.ListActionImpl).ListOptions.Limit)
		return false, nil, nil
	})
	if err := c.Why(t.Context(), "jobs", "etl", io.Discard, FormatTable); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(limits) == 0 {
		t.Fatal("why listed no pods")
	}
	for _, l := range limits {
		if l != listPageSize {
			t.Errorf("a pod list asked for %d per page, want %d", l, listPageSize)
		}
	}
}
