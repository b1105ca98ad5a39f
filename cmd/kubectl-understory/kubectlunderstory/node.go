package kubectlunderstory

import (
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
)

// Batch pod states in Node's table; the others are the BatchSlowed condition's reason,
// lower case (throttled, suspended, evicted).
const (
	stateRunning = "running"
	stateFrozen  = "frozen"
)

// NodeReport is what Node found.
type NodeReport struct {
	Node  string
	Agent string // namespace/name of the agent pod
	// Published is what the Node carries: understory.io/batch-cpu (cores) and
	// batch-memory (bytes) in status.allocatable; nil when absent.
	PublishedCPU, PublishedMemory *float64
	Status                        *AgentStatus
	// Pods are the batch pods of /status with their state.
	Pods []NodePod
	// Notes are what could not be read (a missing right to list pods, ...).
	Notes []string
}

// NodePod is one batch pod and its state.
type NodePod struct {
	AgentPod
	State string
	// Since is when its BatchSlowed condition last changed; Message its message.
	Since   time.Time
	Message string
}

// Node writes the node agent's view of node to out: the budget and each term, what it
// publishes and what the Node carries, and each batch pod's state (FormatJSON: the
// agent's /status as it came).
func (c *Client) Node(ctx context.Context, node string, out io.Writer, format Format) error {
	if node == "" {
		return fmt.Errorf("%w: kubectl understory node NAME", ErrUsage)
	}
	n, err := c.kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return apiError(err, "get", "nodes", "", node)
	}
	agent, err := c.agentPod(ctx, node)
	if err != nil {
		return err
	}
	raw, st, err := c.agentStatus(ctx, agent)
	if err != nil {
		return err
	}
	if format != FormatTable {
		return writeData(out, format, raw)
	}
	r := NodeReport{Node: node, Agent: agent.Namespace + "/" + agent.Name, Status: st}
	if q, ok := n.Status.Allocatable[contract.ResourceBatchCPU]; ok {
		v := float64(q.Value()) / 1000
		r.PublishedCPU = &v
	}
	if q, ok := n.Status.Allocatable[contract.ResourceBatchMemory]; ok {
		v := float64(q.Value())
		r.PublishedMemory = &v
	}
	conds := map[string]*corev1.Pod{}
	pods, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		r.Notes = append(r.Notes, "states from the agent only: "+apiError(err, "list", "pods", "", "").Error())
	} else {
		for i := range pods.Items {
			conds[string(pods.Items[i].UID)] = &pods.Items[i]
		}
	}
	for _, p := range st.Pods[string(qos.ClassBatch)] {
		np := NodePod{AgentPod: p, State: stateRunning}
		if pod := conds[p.UID]; pod != nil {
			if cond := batchCondition(pod); cond != nil {
				np.Since, np.Message = cond.LastTransitionTime.Time, cond.Message
				if cond.Status == corev1.ConditionTrue {
					np.State = strings.ToLower(cond.Reason)
				}
			}
		}
		if st.Escalation.Freeze {
			np.State = stateFrozen
		}
		r.Pods = append(r.Pods, np)
	}
	sort.Slice(r.Pods, func(i, j int) bool {
		a, b := r.Pods[i], r.Pods[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	return writeNode(out, &r, c.opts.Now())
}

// writeNode is Node's table.
func writeNode(out io.Writer, r *NodeReport, now time.Time) error {
	st := r.Status
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	health := "healthy"
	if !st.Healthy {
		health = "NOT healthy"
	}
	fmt.Fprintf(w, "Node %s: agent %s, /status %s old, %s\n", r.Node, r.Agent, age(now, st.Time), health)
	b := st.Budget
	fmt.Fprintf(w, "\nBatch CPU budget (cores)\n")
	fmt.Fprintf(w, "  node CPUs × threshold\t%.2f × %.2f = %.2f\n", b.NodeCPUs, b.Threshold, b.NodeCPUs*b.Threshold)
	fmt.Fprintf(w, "  − LS usage\t%.2f\n", b.LSUsage)
	fmt.Fprintf(w, "  − system usage\t%.2f\n", b.SystemUsage)
	fmt.Fprintf(w, "  = left for batch\t%.2f\n", b.Raw)
	fmt.Fprintf(w, "  clamped to [min, max]\t[%.2f, %.2f] → target %.2f\n", b.Min, b.Max, b.Target)
	fmt.Fprintf(w, "  applied\t%.2f\t%s\n", b.Applied, b.Reason)
	if st.Tier.QuotaCores != nil {
		fmt.Fprintf(w, "  batch tier quota\t%s\t%s\n", cores(*st.Tier.QuotaCores), st.Tier.Cgroup)
	}
	sig := st.Signals.Active
	if sig == "" {
		sig = "unknown"
	}
	if lc := st.Signals.LastCut; lc != nil {
		sig += fmt.Sprintf("; last cut %s ago by %s", age(now, lc.Time), lc.Signal)
		if lc.Pod != "" {
			sig += fmt.Sprintf(" (LS pod %s, %.1f ms)", lc.Pod, 1000*lc.ValueSeconds)
		}
	}
	fmt.Fprintf(w, "  LS harm signal\t%s\n", sig)
	esc := st.Escalation
	line := esc.Level.String()
	if esc.Reason != "" {
		line += ": " + esc.Reason
	}
	if esc.Starved {
		line += fmt.Sprintf(" (batch starved for %v)", esc.StarvedFor.Duration.Round(time.Second))
	}
	fmt.Fprintf(w, "  escalation\t%s\n", line)

	u := st.Usage
	fmt.Fprintf(w, "\nCPU use (cores)\tnode %.2f of %.0f: LS %.2f, BE %.2f, batch %.2f, system %.2f\n", u.Node, u.CPUs,
		u.LS, u.BE, u.Batch, u.System)
	m := st.Memory
	fmt.Fprintf(w, "Memory\t%s of %s: LS %s, BE %s, batch %s, system %s\n", bytesStr(m.Used), bytesStr(m.Capacity),
		bytesStr(m.LS), bytesStr(m.BE), bytesStr(m.Batch), bytesStr(m.System))

	cpu, mem := st.BatchResources.CPU, st.BatchResources.Memory
	fmt.Fprintf(w, "\nPublished for the scheduler\tcpu (cores)\tmemory\n")
	fmt.Fprintf(w, "  capacity × threshold\t%.2f\t%s\n", cpu.Capacity*cpu.Threshold, bytesStr(mem.Capacity*mem.Threshold))
	fmt.Fprintf(w, "  − LS term\t%.2f\t%s\n", cpu.LSTerm, bytesStr(mem.LSTerm))
	fmt.Fprintf(w, "  − BE (recent)\t%.2f\t%s\n", cpu.BERecent, bytesStr(mem.BERecent))
	fmt.Fprintf(w, "  − system (recent)\t%.2f\t%s\n", cpu.SystemRecent, bytesStr(mem.SystemRecent))
	fmt.Fprintf(w, "  batch requests (floor)\t%.2f\t%s\n", cpu.BatchRequest, bytesStr(mem.BatchRequest))
	fmt.Fprintf(w, "  published\t%.2f\t%s\n", cpu.Published, bytesStr(mem.Published))
	pc, pm := "none", "none"
	if r.PublishedCPU != nil {
		pc = fmt.Sprintf("%.2f", *r.PublishedCPU)
	}
	if r.PublishedMemory != nil {
		pm = bytesStr(*r.PublishedMemory)
	}
	fmt.Fprintf(w, "  on the Node (allocatable)\t%s\t%s\n", pc, pm)
	if err := w.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(out, "\nBatch pods (%d)\n", len(r.Pods))
	if len(r.Pods) > 0 {
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAMESPACE\tNAME\tSTATE\tSINCE\tPLACEMENT\tCPU\tQUOTA\tMEMORY LIMIT")
		for _, p := range r.Pods {
			quota, memLimit, since := "-", "-", "-"
			if p.QuotaCores != nil {
				quota = cores(*p.QuotaCores)
			}
			if p.MemoryLimitBytes != nil {
				memLimit = bytesStr(*p.MemoryLimitBytes)
			}
			if !p.Since.IsZero() {
				since = age(now, p.Since)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\n", p.Namespace, p.Name, p.State, since, p.Placement,
				p.UsageCores, quota, memLimit)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		for _, p := range r.Pods {
			if p.State != stateRunning && p.Message != "" {
				fmt.Fprintf(out, "  %s/%s: %s\n", p.Namespace, p.Name, p.Message)
			}
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(out, "note: %s\n", n)
	}
	return nil
}

// cores writes a CFS limit in cores; a negative one is no limit.
func cores(v float64) string {
	if v < 0 || math.IsNaN(v) {
		return "none"
	}
	return fmt.Sprintf("%.2f", v)
}

// bytesStr writes a byte count short, in kubectl's binary units (Ki, Mi, Gi).
func bytesStr(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "?"
	}
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	switch {
	case v >= 1<<30:
		return fmt.Sprintf("%s%.1fGi", sign, v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%s%.0fMi", sign, v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%s%.0fKi", sign, v/(1<<10))
	}
	return fmt.Sprintf("%s%.0f", sign, v)
}

// age writes how long ago t was, like kubectl's AGE column.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
