package kubectlunderstory

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/scheduler-extender/gang"
)

// maxEvents and maxNodes bound Why's lists (the newest events, the roomiest nodes).
const (
	maxEvents = 10
	maxNodes  = 10
)

// WhyReport is what Why found about one pod.
type WhyReport struct {
	Pod   string `json:"pod"`
	UID   string `json:"uid"`
	Phase string `json:"phase"`
	Node  string `json:"node,omitempty"`
	Class string `json:"class"`
	// ClassError is why the pod's class annotation is invalid.
	ClassError string `json:"classError,omitempty"`
	// Requests are the pod's requests of the batch and GPU resources.
	Requests map[string]string `json:"requests,omitempty"`
	// Events are the pod's newest Warning events (FailedScheduling with the extender's
	// reasons; BatchThrottled, BatchFrozen and evictions from the agent).
	Events []WhyEvent `json:"events,omitempty"`
	// Pending: its gang, and the nodes' batch resources against its request.
	Gang       *WhyGang  `json:"gang,omitempty"`
	Nodes      []NodeFit `json:"nodes,omitempty"`
	NodesFit   int       `json:"nodesFit"`
	NodesTotal int       `json:"nodesTotal"`
	// Running: its BatchSlowed condition and the node agent's view of it.
	Condition *corev1.PodCondition `json:"condition,omitempty"`
	Agent     *AgentPod            `json:"agent,omitempty"`
	// AgentFreeze is whether the agent has batch frozen on the pod's node.
	AgentFreeze bool     `json:"agentFreeze,omitempty"`
	Notes       []string `json:"notes,omitempty"`
}

// WhyEvent is one event of the pod.
type WhyEvent struct {
	Last    time.Time `json:"last"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	From    string    `json:"from,omitempty"`
	Count   int32     `json:"count"`
	Message string    `json:"message"`
}

// WhyGang is the pod's gang.
type WhyGang struct {
	Dialect   string `json:"dialect"`
	Name      string `json:"name"`
	MinMember int64  `json:"minMember"`
	// Phase is the PodGroup's status.phase ("" for Koordinator's annotations, or when
	// the PodGroup could not be read).
	Phase string `json:"phase,omitempty"`
	// Members counts the gang's pods in the namespace; Scheduled those bound to a node.
	Members   int `json:"members"`
	Scheduled int `json:"scheduled"`
	// State is the extender's understory.io/gang-state annotation on the pod.
	State string `json:"state,omitempty"`
}

// NodeFit is one node's batch resources (allocatable, and what is left after the
// requests of the pods bound to it) against the pod's request.
type NodeFit struct {
	Node string `json:"node"`
	// Allocatable and Free per resource name, in the resource's own units.
	Allocatable map[string]int64 `json:"allocatable"`
	Free        map[string]int64 `json:"free"`
	Fits        bool             `json:"fits"`
	// Short is what the pod lacks there ("" when it fits).
	Short string `json:"short,omitempty"`
}

// watched are the resources Why compares: the batch and GPU resources.
func watched() []string {
	return []string{contract.ResourceBatchCPU, contract.ResourceBatchMemory, contract.ResourceGPUMilli, contract.ResourceGPU}
}

// Why writes why the pod namespace/name is Pending or slowed to out.
func (c *Client) Why(ctx context.Context, namespace, name string, out io.Writer, format Format) error {
	if name == "" {
		return fmt.Errorf("%w: kubectl understory why POD [-n NAMESPACE]", ErrUsage)
	}
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	pod, err := c.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return apiError(err, "get", "pods", namespace, name)
	}
	r := &WhyReport{Pod: namespace + "/" + name, UID: string(pod.UID), Phase: string(pod.Status.Phase),
		Node: pod.Spec.NodeName, Requests: map[string]string{}}
	class, err := qos.Classify(pod)
	r.Class = string(class)
	if err != nil {
		r.ClassError = err.Error()
	}
	req := podRequests(pod)
	for _, n := range watched() {
		if v, ok := req[n]; ok {
			r.Requests[n] = quantityString(n, v)
		}
	}
	if err := c.whyEvents(ctx, pod, r); err != nil {
		r.Notes = append(r.Notes, "events: "+err.Error())
	}
	if pod.Spec.NodeName == "" {
		c.whyPending(ctx, pod, req, r)
	} else {
		c.whyRunning(ctx, pod, r)
	}
	if format != FormatTable {
		data, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		return writeData(out, format, data)
	}
	return writeWhy(out, r, c.opts.Now())
}

// whyEvents adds the pod's newest Warning events.
func (c *Client) whyEvents(ctx context.Context, pod *corev1.Pod, r *WhyReport) error {
	list, err := c.kube.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": "Pod", "involvedObject.name": pod.Name}.String()})
	if err != nil {
		return apiError(err, "list", "events", pod.Namespace, "")
	}
	for _, e := range list.Items {
		if e.InvolvedObject.Name != pod.Name || (e.InvolvedObject.UID != "" && e.InvolvedObject.UID != pod.UID) ||
			e.Type != corev1.EventTypeWarning {
			continue
		}
		last := e.LastTimestamp.Time
		if last.IsZero() {
			last = e.EventTime.Time
		}
		from := e.Source.Component
		if from == "" {
			from = e.ReportingController
		}
		count := e.Count
		if count == 0 {
			count = 1
		}
		r.Events = append(r.Events, WhyEvent{Last: last, Type: e.Type, Reason: e.Reason, From: from, Count: count,
			Message: strings.TrimSpace(e.Message)})
	}
	sort.SliceStable(r.Events, func(i, j int) bool { return r.Events[i].Last.After(r.Events[j].Last) })
	if len(r.Events) > maxEvents {
		r.Events = r.Events[:maxEvents]
	}
	return nil
}

// whyPending adds the gang and the nodes' room.
func (c *Client) whyPending(ctx context.Context, pod *corev1.Pod, req map[string]int64, r *WhyReport) {
	if err := c.whyGang(ctx, pod, r); err != nil {
		r.Notes = append(r.Notes, "gang: "+err.Error())
	}
	need := false
	for _, n := range watched() {
		if req[n] > 0 {
			need = true
		}
	}
	if !need {
		r.Notes = append(r.Notes, "the pod requests none of "+strings.Join(watched(), ", ")+
			": the batch resources do not hold it back")
		return
	}
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		r.Notes = append(r.Notes, "nodes: "+apiError(err, "list", "nodes", "", "").Error())
		return
	}
	used := map[string]map[string]int64{}
	err = c.eachPod(ctx, "", metav1.ListOptions{FieldSelector: "spec.nodeName!=," +
		"status.phase!=" + string(corev1.PodSucceeded) + ",status.phase!=" + string(corev1.PodFailed)}, func(p *corev1.Pod) {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return
		}
		if used[p.Spec.NodeName] == nil {
			used[p.Spec.NodeName] = map[string]int64{}
		}
		for n, v := range podRequests(p) {
			used[p.Spec.NodeName][n] += v
		}
	})
	if err != nil {
		r.Notes = append(r.Notes, "free resources unknown (allocatable only): "+apiError(err, "list", "pods", "", "").Error())
		used = map[string]map[string]int64{}
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		fit := NodeFit{Node: n.Name, Allocatable: map[string]int64{}, Free: map[string]int64{}, Fits: true}
		var short []string
		for _, res := range watched() {
			q, ok := n.Status.Allocatable[corev1.ResourceName(res)]
			if !ok && req[res] == 0 {
				continue
			}
			fit.Allocatable[res] = q.Value()
			fit.Free[res] = q.Value() - used[n.Name][res]
			if req[res] > fit.Free[res] {
				fit.Fits = false
				short = append(short, fmt.Sprintf("%s: needs %s, %s free", res, quantityString(res, req[res]),
					quantityString(res, max(0, fit.Free[res]))))
			}
		}
		if n.Spec.Unschedulable {
			fit.Fits = false
			short = append(short, "cordoned")
		}
		fit.Short = strings.Join(short, "; ")
		if fit.Fits {
			r.NodesFit++
		}
		r.Nodes = append(r.Nodes, fit)
	}
	r.NodesTotal = len(r.Nodes)
	sort.SliceStable(r.Nodes, func(i, j int) bool {
		a, b := r.Nodes[i], r.Nodes[j]
		if a.Fits != b.Fits {
			return a.Fits
		}
		if fa, fb := a.Free[contract.ResourceBatchCPU], b.Free[contract.ResourceBatchCPU]; fa != fb {
			return fa > fb
		}
		return a.Node < b.Node
	})
	if len(r.Nodes) > maxNodes {
		r.Nodes = r.Nodes[:maxNodes]
	}
}

// whyGang adds the pod's gang, in whichever dialect it is written.
func (c *Client) whyGang(ctx context.Context, pod *corev1.Pod, r *WhyReport) error {
	g := &WhyGang{State: pod.Annotations[contract.AnnotationGangState]}
	var gvr *schema.GroupVersionResource
	var member func(p *corev1.Pod) bool
	switch {
	case pod.Labels[contract.LabelPodGroup] != "":
		g.Dialect, g.Name, gvr = "podgroup (scheduling.x-k8s.io)", pod.Labels[contract.LabelPodGroup], &extender.PodGroupGVR
		member = func(p *corev1.Pod) bool { return p.Labels[contract.LabelPodGroup] == g.Name }
	case volcanoGroup(pod) != "":
		g.Dialect, g.Name, gvr = "volcano", volcanoGroup(pod), &extender.VolcanoPodGroupGVR
		member = func(p *corev1.Pod) bool { return volcanoGroup(p) == g.Name }
		if v, err := gang.ParseMinMember(pod.Annotations[contract.AnnotationVolcanoMinMember]); err == nil {
			g.MinMember = int64(v) // as the extender reads it
		}
	case pod.Annotations[contract.AnnotationKoordinatorName] != "":
		g.Dialect, g.Name = "koordinator", pod.Annotations[contract.AnnotationKoordinatorName]
		member = func(p *corev1.Pod) bool { return p.Annotations[contract.AnnotationKoordinatorName] == g.Name }
		if v, err := gang.ParseMinMember(pod.Annotations[contract.AnnotationKoordinatorMinAvailable]); err == nil {
			g.MinMember = int64(v)
		}
	default:
		return nil
	}
	r.Gang = g
	var errs []string
	if gvr != nil && c.dyn != nil {
		resName := gvr.Resource + "." + gvr.Group
		u, err := c.dyn.Resource(*gvr).Namespace(pod.Namespace).Get(ctx, g.Name, metav1.GetOptions{})
		if err != nil {
			errs = append(errs, apiError(err, "get", resName, pod.Namespace, g.Name).Error())
		} else {
			if v, ok, _ := unstructured.NestedInt64(u.Object, "spec", "minMember"); ok {
				g.MinMember = v
			}
			g.Phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
		}
	}
	var members, scheduled int
	err := c.eachPod(ctx, pod.Namespace, metav1.ListOptions{}, func(p *corev1.Pod) {
		if member(p) && p.DeletionTimestamp == nil {
			members++
			if p.Spec.NodeName != "" {
				scheduled++
			}
		}
	})
	if err != nil {
		errs = append(errs, apiError(err, "list", "pods", pod.Namespace, "").Error())
	} else {
		g.Members += members
		g.Scheduled += scheduled
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func volcanoGroup(p *corev1.Pod) string {
	if v := p.Annotations[contract.AnnotationVolcanoGroupName]; v != "" {
		return v
	}
	return p.Annotations[contract.AnnotationVolcanoGroupNameAlt]
}

// whyRunning adds the pod's condition and the agent's view of it.
func (c *Client) whyRunning(ctx context.Context, pod *corev1.Pod, r *WhyReport) {
	r.Condition = batchCondition(pod)
	if r.Class != string(qos.ClassBatch) {
		r.Notes = append(r.Notes, "not a batch pod: the node agent does not hold it back")
		return
	}
	agent, err := c.agentPod(ctx, pod.Spec.NodeName)
	if err != nil {
		r.Notes = append(r.Notes, "the agent's view: "+err.Error())
		return
	}
	_, st, err := c.agentStatus(ctx, agent)
	if err != nil {
		r.Notes = append(r.Notes, "the agent's view: "+err.Error())
		return
	}
	r.AgentFreeze = st.Escalation.Freeze
	for _, ps := range st.Pods {
		for i := range ps {
			if ps[i].UID == string(pod.UID) {
				p := ps[i]
				r.Agent = &p
			}
		}
	}
	if r.Agent == nil {
		r.Notes = append(r.Notes, "the agent on "+pod.Spec.NodeName+" does not list the pod (yet)")
	}
}

// podRequests sums the pod's requests of the watched resources (Koordinator's batch
// names count as Understory's): its containers', or an init container's where larger.
func podRequests(pod *corev1.Pod) map[string]int64 {
	sum := map[string]int64{}
	add := func(to map[string]int64, rl corev1.ResourceList) {
		for n, q := range rl {
			name := string(n)
			if canon, ok := contract.BatchResourceName(name); ok {
				name = canon
			}
			to[name] += q.Value()
		}
	}
	for _, ctr := range pod.Spec.Containers {
		add(sum, ctr.Resources.Requests)
	}
	for _, ctr := range pod.Spec.InitContainers {
		one := map[string]int64{}
		add(one, ctr.Resources.Requests)
		for n, v := range one {
			sum[n] = max(sum[n], v)
		}
	}
	out := map[string]int64{}
	for _, n := range watched() {
		if v := sum[n]; v > 0 {
			out[n] = v
		}
	}
	return out
}

// quantityString writes a value of a resource in people's units: batch-cpu (millicores)
// as cores with two decimals, batch-memory as bytes in binary units.
func quantityString(res string, v int64) string {
	switch res {
	case contract.ResourceBatchCPU:
		return strconv.FormatFloat(float64(v)/1000, 'f', 2, 64)
	case contract.ResourceBatchMemory:
		return bytesStr(float64(v))
	}
	return strconv.FormatInt(v, 10)
}

// writeWhy is Why's table.
func writeWhy(out io.Writer, r *WhyReport, now time.Time) error {
	fmt.Fprintf(out, "Pod %s: %s", r.Pod, r.Phase)
	if r.Node != "" {
		fmt.Fprintf(out, " on %s", r.Node)
	}
	fmt.Fprintf(out, ", class %s", r.Class)
	if r.ClassError != "" {
		fmt.Fprintf(out, " (invalid class annotation: %s)", r.ClassError)
	}
	fmt.Fprintln(out)
	if len(r.Requests) > 0 {
		var rs []string
		for _, n := range watched() {
			if v, ok := r.Requests[n]; ok {
				rs = append(rs, n+"="+v)
			}
		}
		fmt.Fprintf(out, "Requests: %s\n", strings.Join(rs, ", "))
	}
	if c := r.Condition; c != nil {
		fmt.Fprintf(out, "\nCondition %s=%s, reason %s, since %s ago:\n  %s\n", c.Type, c.Status, c.Reason,
			age(now, c.LastTransitionTime.Time), c.Message)
	} else if r.Node != "" {
		fmt.Fprintf(out, "\nCondition %s: not set (the agent has not held the pod back)\n", contract.ConditionBatchSlowed)
	}
	if a := r.Agent; a != nil {
		quota, memLimit := "none", "none"
		if a.QuotaCores != nil {
			quota = cores(*a.QuotaCores)
		}
		if a.MemoryLimitBytes != nil {
			memLimit = bytesStr(*a.MemoryLimitBytes)
		}
		frozen := ""
		if r.AgentFreeze {
			frozen = "; batch is frozen on this node"
		}
		fmt.Fprintf(out, "\nThe node agent: placement %s, using %.2f cores, CPU quota %s, memory limit %s%s\n",
			a.Placement, a.UsageCores, quota, memLimit, frozen)
		if a.Error != "" {
			fmt.Fprintf(out, "  error: %s\n", a.Error)
		}
	}
	if g := r.Gang; g != nil {
		phase := g.Phase
		if phase == "" {
			phase = "-"
		}
		fmt.Fprintf(out, "\nGang %s (%s): minMember %d, %d members, %d scheduled, PodGroup phase %s\n", g.Name, g.Dialect,
			g.MinMember, g.Members, g.Scheduled, phase)
		if g.Members < int(g.MinMember) {
			fmt.Fprintf(out, "  waiting for %d more member(s) to be created\n", int(g.MinMember)-g.Members)
		}
		if g.State != "" {
			fmt.Fprintf(out, "  extender's gang state: %s\n", g.State)
		}
	}
	if r.NodesTotal > 0 {
		fmt.Fprintf(out, "\nNodes: %d of %d have room for the request", r.NodesFit, r.NodesTotal)
		if len(r.Nodes) < r.NodesTotal {
			fmt.Fprintf(out, " (the %d roomiest)", len(r.Nodes))
		}
		fmt.Fprintln(out)
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NODE\tBATCH-CPU FREE/ALLOC\tBATCH-MEMORY FREE/ALLOC\tGPU-MILLI FREE/ALLOC\tFITS")
		for _, n := range r.Nodes {
			col := func(res string) string {
				a, ok := n.Allocatable[res]
				if !ok {
					return "-"
				}
				return quantityString(res, max(0, n.Free[res])) + "/" + quantityString(res, a)
			}
			fits := "yes"
			if !n.Fits {
				fits = "no: " + n.Short
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Node, col(contract.ResourceBatchCPU), col(contract.ResourceBatchMemory),
				col(contract.ResourceGPUMilli), fits)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if len(r.Events) > 0 {
		fmt.Fprintf(out, "\nWarning events (newest first)\n")
		for _, e := range r.Events {
			fmt.Fprintf(out, "  %s ago  %s  (x%d, %s)\n    %s\n", age(now, e.Last), e.Reason, e.Count, e.From,
				strings.ReplaceAll(e.Message, "\n", "\n    "))
		}
	} else if r.Node == "" {
		fmt.Fprintf(out, "\nNo Warning events: the scheduler has not tried the pod yet, or its events expired\n")
	}
	for _, n := range r.Notes {
		fmt.Fprintf(out, "note: %s\n", n)
	}
	return nil
}
