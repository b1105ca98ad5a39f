package helmchart_test

import "testing"

// An upgrade needs no room beyond what the release holds and takes none from other
// pods: every Deployment replaces a pod before it starts another (maxSurge 0), no
// DaemonSet surges, and every pod runs at a PriorityClass that never preempts (the
// chart's own understory-critical, or none). On a full node a surge replica, or a
// new agent pod while the old one terminates, would otherwise preempt the LS pods
// there (test/e2e/realnode TestUpgrade shows the whole upgrade).
func TestChartUpgradesTakeNoRoom(t *testing.T) {
	t.Parallel()
	objs := renderValues(t, findHelm(t),
		"gpu: {enabled: true}\nsecondScheduler: {enabled: true}\nkueue: {enabled: true}\nkoordinator: {enabled: true}\n")
	classes := map[string]string{} // PriorityClass → preemptionPolicy
	for _, o := range objs {
		if o["kind"] == "PriorityClass" {
			policy, _ := o["preemptionPolicy"].(string)
			classes[dig(o, "metadata", "name").(string)] = policy
		}
	}
	workloads := 0
	for _, o := range objs {
		var surge any
		switch o["kind"] {
		case "Deployment":
			if got := dig(o, "spec", "strategy", "rollingUpdate", "maxUnavailable"); got != float64(1) {
				t.Errorf("%s: maxUnavailable %v, want 1 (one pod replaced at a time)", key(o), got)
			}
			surge = dig(o, "spec", "strategy", "rollingUpdate", "maxSurge")
		case "DaemonSet":
			surge = dig(o, "spec", "updateStrategy", "rollingUpdate", "maxSurge")
			if surge == nil {
				surge = float64(0) // a DaemonSet's default
			}
		default:
			continue
		}
		workloads++
		if surge != float64(0) {
			t.Errorf("%s: maxSurge %v, want 0 (an upgrade needs no room beyond the release's own)", key(o), surge)
		}
		pc, _ := dig(o, "spec", "template", "spec", "priorityClassName").(string)
		if policy, ours := classes[pc]; pc != "" && (!ours || policy != "Never") {
			t.Errorf("%s: priorityClassName %q (the chart's: %v, preemptionPolicy %q), want one of the chart's that "+
				"never preempts", key(o), pc, ours, policy)
		}
	}
	if workloads < 6 {
		t.Errorf("%d workloads rendered with every feature on, want them all", workloads)
	}
}
