package kubectlunderstory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	restclient "k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet"
	"github.com/understory/understory/qos"
	extender "github.com/understory/understory/scheduler-extender"
)

// testNow is the tests' clock.
var testNow = time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)

// fakeProxy is what the API server's pod proxy answers.
type fakeProxy struct {
	body []byte
	err  error
}

func (f fakeProxy) DoRaw(context.Context) ([]byte, error) { return f.body, f.err }
func (f fakeProxy) Stream(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(f.body)), f.err
}

var _ restclient.ResponseWrapper = fakeProxy{}

func ptr(v float64) *float64 { return &v }

// agentStatusJSON is an agent's /status, encoded from the agent's own type (so the
// plugin's field names are checked against the agent's).
func agentStatusJSON(t testing.TB, freeze bool) []byte {
	t.Helper()
	s := koordlet.Status{
		Time: testNow.Add(-2 * time.Second), Node: "node-a", Healthy: true,
		Usage: koordlet.Usage{CPUs: 8, Node: 5.1, LS: 3.2, BE: 0.1, Batch: 1.5, System: 0.3},
		Budget: koordlet.BudgetStatus{NodeCPUs: 8, Threshold: 0.7, LSUsage: 3.2, SystemUsage: 0.3, Raw: 2.1, Min: 0.1,
			Max: 8, Target: 2.1, Applied: 1.8, Reason: "restore limited"},
		Tier:   koordlet.TierStatus{Cgroup: "kubepods/understory-batch", QuotaCores: ptr(1.2)},
		Memory: koordlet.MemoryUsage{Capacity: 32 << 30, Used: 12 << 30, LS: 8 << 30, BE: 1 << 30, Batch: 2 << 30, System: 1 << 30},
		BatchResources: koordlet.BatchResourcesStatus{Reclaimed: qos.Reclaimed{
			CPU: qos.ReclaimTerms{Capacity: 8, Threshold: 0.7, LSTerm: 3.4, BERecent: 0.1, SystemRecent: 0.3,
				BatchRequest: 1, Published: 1.8},
			Memory: qos.ReclaimTerms{Capacity: 32 << 30, Threshold: 0.9, LSTerm: 9 << 30, BERecent: 1 << 30,
				SystemRecent: 1 << 30, BatchRequest: 2 << 30, Published: 16 << 30}}},
		Escalation: qos.EscalationDecision{Level: qos.EscalationThrottle, Reason: "LS leaves room", Freeze: freeze},
		Pods: map[string][]koordlet.PodEntry{
			"LS": {{Namespace: "web", Name: "frontend", UID: "uid-frontend", UsageCores: 3.2}},
			"batch": {
				{Namespace: "jobs", Name: "train-0", UID: "uid-train-0", UsageCores: 1.1, QuotaCores: ptr(-1),
					Placement: "tier", MemoryLimitBytes: ptr(4 << 30)},
				{Namespace: "jobs", Name: "etl", UID: "uid-etl", UsageCores: 0.4, QuotaCores: ptr(0.4), Placement: "in-place"},
			},
		},
	}
	s.Signals.Active = "ebpf"
	s.Signals.LastCut = &koordlet.CutStatus{Signal: "runqueue_delay", Time: testNow.Add(-90 * time.Second),
		Pod: "web/frontend", ValueSeconds: 0.004}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func agentPodObj(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultAgentNamespace, Name: "understory-koordlet-abcde",
			Labels: map[string]string{"app.kubernetes.io/name": "understory-koordlet"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "koordlet",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9316}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func batchNode(name string, cpuMilli, memBytes int64) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		contract.ResourceBatchCPU:    *resource.NewQuantity(cpuMilli, resource.DecimalSI),
		contract.ResourceBatchMemory: *resource.NewQuantity(memBytes, resource.BinarySI),
	}}}
}

func batchPod(ns, name, node string, cpuMilli, memBytes int64) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: k8stypes.UID("uid-" + name),
			Annotations: map[string]string{contract.AnnotationQOSClass: "batch"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				contract.ResourceBatchCPU:    *resource.NewQuantity(cpuMilli, resource.DecimalSI),
				contract.ResourceBatchMemory: *resource.NewQuantity(memBytes, resource.BinarySI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if node == "" {
		p.Status.Phase = corev1.PodPending
	}
	return p
}

func slowed(p *corev1.Pod, reason qos.BatchSlowReason, msg string, since time.Time) *corev1.Pod {
	w := qos.WrittenBatchCondition{BatchCondition: qos.BatchCondition{Reason: reason, Message: msg}, At: since, Since: since}
	p.Status.Conditions = append(p.Status.Conditions, w.PodCondition())
	return p
}

func warning(ns, pod, reason, from, msg string, ago time.Duration, count int32) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: pod + "." + strings.ToLower(reason) + "." + ago.String()},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod, UID: k8stypes.UID("uid-" + pod)},
		Type:           corev1.EventTypeWarning, Reason: reason, Message: msg, Count: count,
		Source:        corev1.EventSource{Component: from},
		LastTimestamp: metav1.NewTime(testNow.Add(-ago)),
	}
}

// cluster is a fake API server: the objects, the agent's /status behind the pod proxy
// (or proxyErr), and PodGroups.
func cluster(t *testing.T, status []byte, proxyErr error, objs []runtime.Object, groups ...runtime.Object) *Client {
	t.Helper()
	kube := fake.NewClientset(objs...)
	kube.PrependProxyReactor("pods", func(a k8stesting.Action) (bool, restclient.ResponseWrapper, error) {
		p := a.(k8stesting.ProxyGetAction)
		if p.GetNamespace() != DefaultAgentNamespace || p.GetPort() != "9316" || p.GetPath() != "status" ||
			p.GetScheme() != "http" {
			return true, fakeProxy{err: errors.New("unexpected proxy request " + p.GetPath())}, nil
		}
		return true, fakeProxy{body: status, err: proxyErr}, nil
	})
	gvrs := map[schema.GroupVersionResource]string{
		extender.PodGroupGVR:        "PodGroupList",
		extender.VolcanoPodGroupGVR: "PodGroupList",
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gvrs, groups...)
	return NewFromClients(kube, dyn, Options{Now: func() time.Time { return testNow }})
}

// golden compares got with testdata/name.golden.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v; the output was:\n%s", path, err, got)
	}
	if got != string(want) {
		t.Errorf("output differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestNode(t *testing.T) {
	t.Parallel()
	objs := func() []runtime.Object {
		return []runtime.Object{
			batchNode("node-a", 1800, 16<<30), agentPodObj("node-a"),
			slowed(batchPod("jobs", "etl", "node-a", 400, 1<<30), qos.BatchThrottled,
				"throttled by the node agent in 80% of its CFS periods", testNow.Add(-3*time.Minute)),
			slowed(batchPod("jobs", "train-0", "node-a", 1000, 4<<30), qos.BatchRunning, "runs free", testNow.Add(-time.Hour)),
		}
	}
	tests := []struct {
		name     string
		freeze   bool
		format   Format
		golden   string
		contains string
	}{
		{name: "table", golden: "node"},
		{name: "frozen", freeze: true, contains: "train-0  frozen"},
		{name: "json", format: FormatJSON, contains: `"applied":1.8`},
		{name: "yaml", format: FormatYAML, contains: "applied: 1.8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status := agentStatusJSON(t, tc.freeze)
			c := cluster(t, status, nil, objs())
			var out bytes.Buffer
			format := tc.format
			if format == "" {
				format = FormatTable
			}
			if err := c.Node(t.Context(), "node-a", &out, format); err != nil {
				t.Fatal(err)
			}
			if tc.golden != "" {
				golden(t, tc.golden, out.String())
			}
			if tc.contains != "" && !strings.Contains(out.String(), tc.contains) {
				t.Errorf("output lacks %q:\n%s", tc.contains, out.String())
			}
		})
	}
}

func TestNodeErrors(t *testing.T) {
	t.Parallel()
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/proxy"}, "understory-koordlet-abcde",
		errors.New("user jane cannot get pods/proxy"))
	tests := []struct {
		name     string
		node     string
		objs     []runtime.Object
		proxyErr error
		body     []byte
		want     error
		contains string
	}{
		{"no such node", "node-x", []runtime.Object{batchNode("node-a", 1, 1)}, nil, nil, ErrNotFound, "nodes node-x"},
		{"no agent on the node", "node-b", []runtime.Object{batchNode("node-b", 1, 1), agentPodObj("node-a")}, nil, nil,
			ErrNoAgent, "node-b"},
		{"proxy forbidden", "node-a", []runtime.Object{batchNode("node-a", 1, 1), agentPodObj("node-a")}, forbidden, nil,
			ErrForbidden, `verb "get" on "pods/proxy"`},
		{"agent unreachable", "node-a", []runtime.Object{batchNode("node-a", 1, 1), agentPodObj("node-a")},
			apierrors.NewServiceUnavailable("dial tcp 10.0.0.5:9316: i/o timeout"), nil, ErrAgentUnreachable, "NetworkPolicy"},
		{"not the agent's JSON", "node-a", []runtime.Object{batchNode("node-a", 1, 1), agentPodObj("node-a")}, nil,
			[]byte("<html>"), ErrAgentUnreachable, "decoding"},
		{"no name", "", nil, nil, nil, ErrUsage, "node NAME"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := cluster(t, tc.body, tc.proxyErr, tc.objs)
			err := c.Node(t.Context(), tc.node, io.Discard, FormatTable)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("error %v, want %v containing %q", err, tc.want, tc.contains)
			}
		})
	}
}

func podGroup(ns, name string, minMember int64, phase string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"minMember": minMember},
		"status":   map[string]any{"phase": phase},
	}}
	return u
}

func TestWhy(t *testing.T) {
	t.Parallel()
	gangMember := func(name, node string) *corev1.Pod {
		p := batchPod("jobs", name, node, 2000, 2<<30)
		p.Labels = map[string]string{contract.LabelPodGroup: "train"}
		return p
	}
	pending := gangMember("train-1", "")
	pending.Annotations[contract.AnnotationGangState] = "waiting: 2 of 3 members placed"
	cordoned := batchNode("node-c", 8000, 32<<30)
	cordoned.Spec.Unschedulable = true
	tests := []struct {
		name   string
		pod    string
		objs   []runtime.Object
		groups []runtime.Object
		status []byte
		golden string
	}{
		{name: "pending gang member", pod: "train-1", golden: "why-pending",
			objs: []runtime.Object{
				pending, gangMember("train-0", "node-a"), gangMember("train-2", "node-b"),
				batchNode("node-a", 3000, 8<<30), batchNode("node-b", 2500, 1<<30), cordoned,
				warning("jobs", "train-1", "FailedScheduling", "default-scheduler",
					"0/3 nodes are available: 1 Insufficient understory.io/batch-memory, 1 node(s) were unschedulable, "+
						"1 understory-scheduler-extender: gang jobs/train waits for 1 more member.", 30*time.Second, 4),
				warning("jobs", "train-1", "FailedScheduling", "default-scheduler", "older", 10*time.Minute, 1),
			},
			groups: []runtime.Object{podGroup("jobs", "train", 3, "Pending")}},
		{name: "running and throttled", pod: "etl", golden: "why-running", status: agentStatusJSON(t, false),
			objs: []runtime.Object{
				slowed(batchPod("jobs", "etl", "node-a", 400, 1<<30), qos.BatchThrottled,
					"throttled by the node agent in 80% of its CFS periods over the last 10s (8 of 10) at a quota of "+
						"0.40 cores (its share of the batch budget, 1.80 cores: what LS leaves)", testNow.Add(-3*time.Minute)),
				agentPodObj("node-a"), batchNode("node-a", 1800, 16<<30),
				warning("jobs", "etl", "BatchThrottled", "understory-koordlet", "throttled by the node agent in 80%", time.Minute, 1),
			}},
		{name: "running, agent unreachable", pod: "etl", golden: "why-running-noagent",
			objs: []runtime.Object{batchPod("jobs", "etl", "node-a", 400, 1<<30), batchNode("node-a", 1800, 16<<30)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := cluster(t, tc.status, nil, tc.objs, tc.groups...)
			var out bytes.Buffer
			if err := c.Why(t.Context(), "jobs", tc.pod, &out, FormatTable); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.golden, out.String())
			var js bytes.Buffer
			if err := c.Why(t.Context(), "jobs", tc.pod, &js, FormatJSON); err != nil {
				t.Fatal(err)
			}
			var r WhyReport
			if err := json.Unmarshal(js.Bytes(), &r); err != nil || r.Pod != "jobs/"+tc.pod {
				t.Errorf("-o json: %v, %+v", err, r)
			}
		})
	}
}

func TestWhyErrors(t *testing.T) {
	t.Parallel()
	c := cluster(t, nil, nil, nil)
	if err := c.Why(t.Context(), "jobs", "nope", io.Discard, FormatTable); !errors.Is(err, ErrNotFound) ||
		!strings.Contains(err.Error(), "pods nope in namespace jobs") {
		t.Errorf("a missing pod: %v", err)
	}
	if err := c.Why(t.Context(), "jobs", "", io.Discard, FormatTable); !errors.Is(err, ErrUsage) {
		t.Errorf("no pod: %v", err)
	}
	if _, err := ParseFormat("xml"); !errors.Is(err, ErrUsage) {
		t.Errorf("-o xml: %v", err)
	}
}
