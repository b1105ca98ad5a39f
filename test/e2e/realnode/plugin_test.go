package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/qos"
)

// pluginName is the kubectl plugin `make build` leaves in bin/ (cmd/kubectl-understory).
const pluginName = "kubectl-understory"

// understory runs `kubectl understory ARGS` as a user does: kubectl finds the plugin on
// PATH (the repository's bin/ first).
func (in *install) understory(ctx context.Context, t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(in.repo, "bin")
	if fi, err := os.Stat(filepath.Join(bin, pluginName)); err != nil || fi.Mode()&0o111 == 0 {
		testenv.SkipOrFailInCI(t, "bin/%s is not built: run `make build` (make e2e-deps does)", pluginName)
	}
	// kubectl passes everything after the plugin's name to the plugin, which reads
	// --kubeconfig itself (kubectl refuses flags before a plugin's name).
	cmd := exec.CommandContext(ctx, in.n.env["KUBECTL"],
		append([]string{"understory", "--kubeconfig", in.n.env["KUBECONFIG"]}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl understory %s: %s: %w", strings.Join(args, " "),
			strings.TrimSpace(string(out)), err)
	}
	return string(out), nil
}

// allocatableLine is the plugin's line with what the Node publishes: two numbers
// (cores, memory), not "none".
var allocatableLine = regexp.MustCompile(`(?m)^\s*on the Node \(allocatable\)\s+[0-9.]+\s+[0-9.]+[KMGT]?i?\s*$`)

// pluginNode: `kubectl understory node NAME` reads the agent's /status through the API
// server's proxy and shows the real node's budget, term by term, what the Node
// publishes, and the batch Job's pod with its state; through port-forward too.
func (in *install) pluginNode(t *testing.T) {
	ctx, n := in.ctx, in.n
	node := n.env["NODE_NAME"]
	var out string
	err := poll(ctx, 30*time.Second, func() (bool, error) {
		var err error
		out, err = in.understory(ctx, t, "node", node)
		return err == nil && allocatableLine.MatchString(out) && strings.Contains(out, in.crunch.Name), nil
	})
	if err != nil {
		t.Fatalf("kubectl understory node %s: %v\n%s", node, err, out)
	}
	for _, want := range []string{
		fmt.Sprintf("Node %s: agent %s/%s", node, nsSystem, in.agentPod.Name),
		"healthy",
		"Batch CPU budget (cores)",
		"node CPUs × threshold",
		"− LS usage",
		"Published for the scheduler",
		"Batch pods (1)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl understory node %s: no %q in\n%s", node, want, out)
		}
	}
	t.Logf("kubectl understory node %s:\n%s", node, out)

	// Where a NetworkPolicy enforcer (Calico, Cilium) refuses the API server's pod proxy,
	// the plugin falls back to port-forward, which kubelet serves inside the agent's
	// network namespace: here forced, with kubectl's own flags and YAML output.
	fwd, err := in.understory(ctx, t, "node", node, "--via", "port-forward", "--request-timeout=30s", "-o", "yaml")
	if err != nil {
		t.Fatalf("kubectl understory node %s --via port-forward: %v", node, err)
	}
	if !strings.Contains(fwd, "healthy: true") || !strings.Contains(fwd, "\nbudget:") {
		t.Errorf("kubectl understory node %s --via port-forward -o yaml: not the agent's /status:\n%s", node, fwd)
	}

	why, err := in.understory(ctx, t, "why", in.crunch.Name, "-n", workNS)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("Pod %s/%s: Running on %s, class batch", workNS, in.crunch.Name, node),
		"The node agent: placement tier",
	} {
		if !strings.Contains(why, want) {
			t.Errorf("kubectl understory why %s: no %q in\n%s", in.crunch.Name, want, why)
		}
	}
	t.Logf("kubectl understory why %s -n %s:\n%s", in.crunch.Name, workNS, why)
}

// batchCondition: with LS loaded the agent cuts batch to its floor (or freezes it) and
// says so on the pod: the condition understory.io/BatchSlowed turns True (Throttled or
// Frozen, with the numbers), which `kubectl understory why` shows; LS idle again, the
// load is lifted.
func (in *install) batchCondition(t *testing.T) {
	ctx, n := in.ctx, in.n
	in.ensureBatchRunning(t)
	in.setLSLoad(t, true)
	defer in.setLSLoad(t, false)
	var cond *corev1.PodCondition
	err := poll(ctx, 45*time.Second, func() (bool, error) {
		p, err := n.client.CoreV1().Pods(workNS).Get(ctx, in.crunch.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		cond = nil
		for i := range p.Status.Conditions {
			if c := &p.Status.Conditions[i]; c.Type == qos.ConditionBatchSlowed {
				cond = c
			}
		}
		return cond != nil && cond.Status == corev1.ConditionTrue, nil
	})
	if err != nil {
		t.Fatalf("batch pod %s with LS loaded: condition %s %+v after 45 s, want True: %v", in.crunch.Name,
			qos.ConditionBatchSlowed, cond, err)
	}
	if (cond.Reason != "Throttled" && cond.Reason != "Frozen") || cond.Message == "" {
		t.Errorf("condition %s: reason %q, message %q: want Throttled or Frozen with the numbers",
			qos.ConditionBatchSlowed, cond.Reason, cond.Message)
	}
	t.Logf("batch pod %s: %s=True, %s: %s", in.crunch.Name, qos.ConditionBatchSlowed, cond.Reason, cond.Message)
	why, err := in.understory(ctx, t, "why", in.crunch.Name, "-n", workNS)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Condition %s=True, reason %s", qos.ConditionBatchSlowed, cond.Reason); !strings.Contains(why, want) {
		t.Errorf("kubectl understory why %s: no %q in\n%s", in.crunch.Name, want, why)
	}
}
