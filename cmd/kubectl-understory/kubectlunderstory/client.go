package kubectlunderstory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/pager"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
)

// Errors to branch on (errors.Is); each comes wrapped with what was asked and why.
var (
	// ErrNotFound: the pod or node named does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNoAgent: no running node agent pod on the node.
	ErrNoAgent = errors.New("no node agent on the node")
	// ErrForbidden: the user's credentials lack a verb; the message names it.
	ErrForbidden = errors.New("forbidden")
	// ErrAgentUnreachable: the API server's proxy could not reach the agent, or it
	// answered with an error.
	ErrAgentUnreachable = errors.New("the node agent's /status is unreachable")
	// ErrUsage: bad arguments.
	ErrUsage = errors.New("usage")
)

// Format is the output format.
type Format string

// The output formats.
const (
	FormatTable Format = "table"
	FormatJSON  Format = "json"
	FormatYAML  Format = "yaml"
)

// ParseFormat reads -o: "" or "table", "json" or "yaml".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "", string(FormatTable):
		return FormatTable, nil
	case string(FormatJSON):
		return FormatJSON, nil
	case string(FormatYAML):
		return FormatYAML, nil
	}
	return "", fmt.Errorf("%w: output format %q: want table, json or yaml", ErrUsage, s)
}

// writeData writes the JSON document data as format asks: as it is (with a final
// newline), or as YAML.
func writeData(out io.Writer, format Format, data []byte) error {
	if format == FormatYAML {
		y, err := yaml.JSONToYAML(data)
		if err != nil {
			return err
		}
		_, err = out.Write(y)
		return err
	}
	if !bytes.HasSuffix(data, []byte("\n")) {
		data = append(data, '\n')
	}
	_, err := out.Write(data)
	return err
}

// Defaults of Options.
const (
	DefaultAgentNamespace = "understory-system"
	// DefaultAgentSelector is the label of the node agent DaemonSet's pods
	// (manifests/koordlet/daemonset).
	DefaultAgentSelector = "app.kubernetes.io/name=understory-koordlet"
	// DefaultAgentPort is the agent's /metrics, /status and /healthz port (plain HTTP),
	// used when its pod names no port "metrics".
	DefaultAgentPort = 9316
)

// Via is how the plugin reaches the node agent's /status.
type Via string

// The ways to the agent.
const (
	// ViaAuto: the API server's pod proxy, and port-forward when the proxy cannot
	// reach the agent (a NetworkPolicy under Calico or Cilium refuses the API server).
	ViaAuto Via = "auto"
	// ViaProxy: the pod proxy only (needs pods/proxy get).
	ViaProxy Via = "proxy"
	// ViaPortForward: port-forward only (needs pods/portforward create); kubelet
	// connects inside the pod's network namespace, where NetworkPolicies do not apply.
	ViaPortForward Via = "port-forward"
)

// ParseVia reads --via: "" or auto, proxy, port-forward.
func ParseVia(s string) (Via, error) {
	switch v := Via(s); v {
	case "":
		return ViaAuto, nil
	case ViaAuto, ViaProxy, ViaPortForward:
		return v, nil
	}
	return "", fmt.Errorf("%w: --via %q: want auto, proxy or port-forward", ErrUsage, s)
}

// Options say where the agent runs and how to reach it.
type Options struct {
	AgentNamespace string // DefaultAgentNamespace when empty
	AgentSelector  string // DefaultAgentSelector when empty
	// Via is how /status is read (ViaAuto when empty).
	Via Via
	// Forward GETs path from port of a pod through port-forward; New sets the API
	// server's. Nil: port-forward is not available.
	Forward func(ctx context.Context, namespace, pod string, port int32, path string) ([]byte, error)
	// Now is the clock for ages in the output (time.Now when nil).
	Now func() time.Time
}

// Client answers the plugin's questions from one cluster.
type Client struct {
	kube kubernetes.Interface
	// dyn reads PodGroups (optional: nil leaves gangs' PodGroups out).
	dyn  dynamic.Interface
	opts Options
}

// New returns a client on cfg (the user's kubeconfig).
func New(cfg *rest.Config, opts Options) (*Client, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the dynamic client: %w", err)
	}
	if opts.Forward == nil {
		opts.Forward = func(ctx context.Context, namespace, pod string, port int32, path string) ([]byte, error) {
			return portForwardGet(ctx, cfg, kube, namespace, pod, port, path)
		}
	}
	return NewFromClients(kube, dyn, opts), nil
}

// NewFromClients returns a client on the given clientsets (tests: client-go's fakes).
func NewFromClients(kube kubernetes.Interface, dyn dynamic.Interface, opts Options) *Client {
	if opts.AgentNamespace == "" {
		opts.AgentNamespace = DefaultAgentNamespace
	}
	if opts.AgentSelector == "" {
		opts.AgentSelector = DefaultAgentSelector
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Via == "" {
		opts.Via = ViaAuto
	}
	return &Client{kube: kube, dyn: dyn, opts: opts}
}

// apiError turns the API server's refusals into the package's errors, naming what was
// asked: verb, resource and namespace.
func apiError(err error, verb, resource, namespace, name string) error {
	if err == nil {
		return nil
	}
	where := resource
	if name != "" {
		where += " " + name
	}
	if namespace != "" {
		where += " in namespace " + namespace
	}
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s: %w", ErrNotFound, where, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: your credentials may not %s %s (RBAC: verb %q on %q): %w", ErrForbidden, verb, where, verb,
			resource, err)
	}
	return fmt.Errorf("%s %s: %w", verb, where, err)
}

// agentPod finds the node agent's pod on node: a running one, the newest first.
func (c *Client) agentPod(ctx context.Context, node string) (*corev1.Pod, error) {
	ns := c.opts.AgentNamespace
	list, err := c.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: c.opts.AgentSelector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, apiError(err, "list", "pods", ns, "")
	}
	var pods []*corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		// A fake clientset ignores field selectors: filter again.
		if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("%w %s: no running pod with labels %s in namespace %s (is the DaemonSet scheduled there? "+
			"kubectl -n %s get pods -l %s -o wide)", ErrNoAgent, node, c.opts.AgentSelector, ns, ns, c.opts.AgentSelector)
	}
	sort.Slice(pods, func(i, j int) bool {
		return pods[j].CreationTimestamp.Before(&pods[i].CreationTimestamp)
	})
	return pods[0], nil
}

// agentPort is the port the agent serves /status on: its container port "metrics".
func agentPort(pod *corev1.Pod) int32 {
	for _, ctr := range pod.Spec.Containers {
		for _, p := range ctr.Ports {
			if p.Name == "metrics" {
				return p.ContainerPort
			}
		}
	}
	return DefaultAgentPort
}

// agentStatus reads the agent's /status, through the API server's pod proxy or
// port-forward as Options.Via says: the raw JSON and its decoded view.
func (c *Client) agentStatus(ctx context.Context, agent *corev1.Pod) ([]byte, *AgentStatus, error) {
	ns := c.opts.AgentNamespace
	var raw []byte
	var err error
	if c.opts.Via != ViaPortForward {
		raw, err = c.proxyStatus(ctx, agent)
	}
	if c.opts.Via == ViaPortForward || c.opts.Via == ViaAuto && errors.Is(err, ErrAgentUnreachable) {
		proxyErr := err
		raw, err = c.forwardStatus(ctx, agent)
		if err != nil && proxyErr != nil {
			err = fmt.Errorf("%w; and %w", proxyErr, err)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	var st AgentStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, nil, fmt.Errorf("%w: decoding the /status of %s/%s: %w", ErrAgentUnreachable, ns, agent.Name, err)
	}
	return raw, &st, nil
}

// proxyStatus GETs /status through the API server's pod proxy.
func (c *Client) proxyStatus(ctx context.Context, agent *corev1.Pod) ([]byte, error) {
	ns := c.opts.AgentNamespace
	port := strconv.Itoa(int(agentPort(agent)))
	raw, err := c.kube.CoreV1().Pods(ns).ProxyGet("http", agent.Name, port, "status", nil).DoRaw(ctx)
	if err != nil {
		if apierrors.IsForbidden(err) {
			return nil, apiError(err, "get", "pods/proxy", ns, agent.Name)
		}
		return nil, fmt.Errorf("%w: GET /api/v1/namespaces/%s/pods/%s:%s/proxy/status: %w (a NetworkPolicy that "+
			"admits only Prometheus to the agent refuses the API server: see docs/operations.md)", ErrAgentUnreachable, ns,
			agent.Name, port, err)
	}
	return raw, nil
}

// forwardStatus GETs /status through port-forward.
func (c *Client) forwardStatus(ctx context.Context, agent *corev1.Pod) ([]byte, error) {
	ns := c.opts.AgentNamespace
	if c.opts.Forward == nil {
		return nil, fmt.Errorf("%w: port-forward is not available", ErrAgentUnreachable)
	}
	raw, err := c.opts.Forward(ctx, ns, agent.Name, agentPort(agent), "/status")
	if err != nil {
		if apierrors.IsForbidden(err) {
			return nil, apiError(err, "create", "pods/portforward", ns, agent.Name)
		}
		return nil, fmt.Errorf("%w: port-forward to %s/%s:%d: %w", ErrAgentUnreachable, ns, agent.Name, agentPort(agent), err)
	}
	return raw, nil
}

// AgentStatus is the part of the node agent's /status (koordlet.Status) the plugin
// shows; the JSON names are the agent's.
type AgentStatus struct {
	Time    time.Time `json:"time"`
	Node    string    `json:"node,omitempty"`
	Healthy bool      `json:"healthy"`
	Usage   struct {
		CPUs   float64 `json:"cpus"`
		Node   float64 `json:"node"`
		LS     float64 `json:"ls"`
		BE     float64 `json:"be"`
		Batch  float64 `json:"batch"`
		System float64 `json:"system"`
	} `json:"usageCores"`
	Budget struct {
		Formula     string  `json:"formula"`
		NodeCPUs    float64 `json:"nodeCPUs"`
		Threshold   float64 `json:"threshold"`
		LSUsage     float64 `json:"lsUsage"`
		SystemUsage float64 `json:"systemUsage"`
		Raw         float64 `json:"raw"`
		Min         float64 `json:"min"`
		Max         float64 `json:"max"`
		Target      float64 `json:"target"`
		Applied     float64 `json:"applied"`
		Reason      string  `json:"reason"`
	} `json:"budget"`
	Tier struct {
		Cgroup           string   `json:"cgroup"`
		QuotaCores       *float64 `json:"quotaCores,omitempty"`
		MemoryLimitBytes *float64 `json:"memoryLimitBytes,omitempty"`
	} `json:"tier"`
	Memory struct {
		Capacity float64 `json:"capacity"`
		Used     float64 `json:"used"`
		LS       float64 `json:"ls"`
		BE       float64 `json:"be"`
		Batch    float64 `json:"batch"`
		System   float64 `json:"system"`
	} `json:"memoryBytes"`
	BatchResources struct {
		qos.Reclaimed
	} `json:"batchResources"`
	Escalation qos.EscalationDecision `json:"escalation"`
	Pods       map[string][]AgentPod  `json:"pods"`
	Signals    struct {
		Active  string `json:"active"`
		LastCut *struct {
			Signal       string    `json:"signal"`
			Time         time.Time `json:"time"`
			Pod          string    `json:"pod,omitempty"`
			ValueSeconds float64   `json:"valueSeconds,omitempty"`
		} `json:"lastCut,omitempty"`
	} `json:"signals"`
}

// AgentPod is one pod of /status.
type AgentPod struct {
	Namespace        string   `json:"namespace"`
	Name             string   `json:"name"`
	UID              string   `json:"uid"`
	Cgroup           string   `json:"cgroup"`
	UsageCores       float64  `json:"usageCores"`
	QuotaCores       *float64 `json:"quotaCores,omitempty"`
	Placement        string   `json:"placement,omitempty"`
	MemoryLimitBytes *float64 `json:"memoryLimitBytes,omitempty"`
	Error            string   `json:"error,omitempty"`
}

// batchCondition is the pod's understory.io/BatchSlowed condition, if any.
func batchCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == contract.ConditionBatchSlowed {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// listPageSize is how many pods one list request asks for: a cluster's pods come in
// pages, as kubectl reads them, not in one response of every pod.
const listPageSize = 500

// eachPod calls fn for every pod of namespace ("": all) that opts select, reading
// them page by page.
func (c *Client) eachPod(ctx context.Context, namespace string, opts metav1.ListOptions, fn func(*corev1.Pod)) error {
	p := pager.New(pager.SimplePageFunc(func(o metav1.ListOptions) (runtime.Object, error) {
		return c.kube.CoreV1().Pods(namespace).List(ctx, o)
	}))
	p.PageSize = listPageSize
	return p.EachListItem(ctx, opts, func(obj runtime.Object) error {
		if pod, ok := obj.(*corev1.Pod); ok {
			fn(pod)
		}
		return nil
	})
}
