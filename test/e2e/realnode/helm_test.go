package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	extender "github.com/understory/understory/scheduler-extender"
)

// The Helm install (charts/understory, README.md "Install").
const (
	helmRelease = "understory"
	chartDir    = "charts/understory"
	// realnodeValues is manifests/overlays/realnode as values (test/helmchart compares
	// the two): its agent configuration, -max-cache-staleness, and the second scheduler
	// on a node without cluster DNS.
	realnodeValues = "charts/understory/ci/realnode-values.yaml"
	// secondScheduler is the profile of components/second-scheduler's kube-scheduler,
	// also its Deployment's and its Lease's name.
	secondScheduler  = "understory-scheduler"
	defaultScheduler = "default-scheduler"
	// kubeSchedulerTar is the second scheduler's image (make e2e-deps).
	kubeSchedulerTar = "kube-scheduler.tar"
	// secondSchedulerPort is kube-scheduler's secure port: its /metrics, for an
	// authorised client (components/second-scheduler/metrics.yaml).
	secondSchedulerPort = 10259
)

// schedulerImage is the tarball of the second scheduler's image, built by make
// e2e-deps next to the project's images.
func schedulerImage(t *testing.T, repo string) string {
	t.Helper()
	p := filepath.Join(repo, "bin", "images", kubeSchedulerTar)
	if _, err := os.Stat(p); err != nil {
		testenv.SkipOrFailInCI(t, "the second scheduler's image is not built (%v): run `make e2e-deps`", err)
	}
	return p
}

// helm runs helm against the node's API server.
func (n *node) helm(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", n.env["KUBECONFIG"]}, args...)...)
	// Helm's caches and configuration in the test's own directories, not the host's.
	home := filepath.Join(filepath.Dir(n.env["KUBECONFIG"]), "helm")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config",
		"HELM_DATA_HOME="+home+"/data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %s: %w", strings.Join(args, " "), strings.TrimSpace(string(out)), err)
	}
	return string(out), nil
}

// helmInstall: `helm install understory charts/understory -n understory-system
// --create-namespace` with the real-node values installs everything in one pass and
// the workloads roll out (the agent, the extender's two replicas, the webhook, the
// second scheduler); every Kustomization under manifests/ passes a server-side dry
// run against this cluster.
func (in *install) helmInstall(t *testing.T) {
	ctx, n := in.ctx, in.n
	out, err := n.helm(ctx, in.helmBin, "install", helmRelease, filepath.Join(in.repo, chartDir),
		"-n", nsSystem, "--create-namespace", "-f", filepath.Join(in.repo, realnodeValues))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "STATUS: deployed") {
		t.Fatalf("helm install: no STATUS: deployed in\n%s", out)
	}
	t.Logf("helm install %s %s -n %s --create-namespace -f %s: deployed", helmRelease, chartDir, nsSystem, realnodeValues)
	if _, err := n.kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/podgroups.scheduling.x-k8s.io"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	in.rolledOut(t)
	leader := in.extenderLeader(t, 60*time.Second)
	t.Logf("agent, extender (leader %s and a standby), webhook and second scheduler rolled out in %v",
		leader.Name, time.Since(start).Round(100*time.Millisecond))

	in.certsFromSecret(t)

	// The examples live in their own namespace: a dry run cannot create it.
	if _, err := n.kubectl(ctx, "create", "namespace", "understory-examples"); err != nil {
		t.Fatal(err)
	}
	for _, dir := range kustomizations(t, in.manifests) {
		rel, _ := filepath.Rel(in.manifests, dir)
		out, err := n.kubectl(ctx, "apply", "--dry-run=server", "-k", dir)
		switch {
		case err != nil:
			t.Errorf("kubectl apply --dry-run=server -k manifests/%s: %v", rel, err)
		case !strings.Contains(out, "(server dry run)"):
			t.Errorf("manifests/%s: not a server dry run:\n%s", rel, out)
		default:
			t.Logf("kubectl apply --dry-run=server -k manifests/%s: %d objects", rel, strings.Count(out, "\n"))
		}
	}
}

// rolledOut waits until the release's workloads (the agent's DaemonSet, the
// extender's, the webhook's and the second scheduler's Deployments) have rolled out.
func (in *install) rolledOut(t *testing.T) {
	t.Helper()
	for _, w := range []string{"daemonset/understory-koordlet", "deployment/" + extenderName,
		"deployment/" + admissionName, "deployment/" + secondScheduler} {
		if _, err := in.n.kubectl(in.ctx, "-n", nsSystem, "rollout", "status", w, "--timeout=180s"); err != nil {
			out, _ := in.n.kubectl(in.ctx, "-n", nsSystem, "get", "pods", "-o", "wide")
			t.Fatalf("%v\n%s", err, out)
		}
	}
}

// extenderLeader returns the extender's leader pod: the holder of its Lease, running
// and Ready, and the one address of the Service's EndpointSlice (the leader writes it;
// the standby is Ready too, synced, but refuses kube-scheduler's calls).
func (in *install) extenderLeader(t *testing.T, timeout time.Duration) *corev1.Pod {
	t.Helper()
	ctx, n := in.ctx, in.n
	var holder string
	var leader *corev1.Pod
	var addrs []string
	err := poll(ctx, timeout, func() (bool, error) {
		l, err := n.client.CoordinationV1().Leases(nsSystem).Get(ctx, extender.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *l.Spec.HolderIdentity
		p, err := n.client.CoreV1().Pods(nsSystem).Get(ctx, holder, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning || !podReady(p) || p.DeletionTimestamp != nil {
			return false, nil
		}
		leader = p
		s, err := n.client.DiscoveryV1().EndpointSlices(nsSystem).Get(ctx, extenderName+extender.LeaderSliceSuffix,
			metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		addrs = addrs[:0]
		for _, e := range s.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
		return slices.Equal(addrs, []string{p.Status.PodIP}), nil
	})
	if err != nil {
		out, _ := n.kubectl(ctx, "-n", nsSystem, "get", "pods", "-o", "wide")
		t.Fatalf("extender leader: Lease %s/%s held by %q, the Service's EndpointSlice names %v: want the "+
			"holder's pod Ready and its IP alone: %v\n%s", nsSystem, extender.LeaseName, holder, addrs, err, out)
	}
	return leader
}

// certsFromSecret writes the CA and the second scheduler's client certificate, which
// Helm generated, into in.certs (the whole test's directory), where the test's
// extender client and Prometheus read them (the names manifests/certs/generate.sh
// gives them).
func (in *install) certsFromSecret(t *testing.T) {
	t.Helper()
	s, err := in.n.client.CoreV1().Secrets(nsSystem).Get(in.ctx, "understory-scheduler-client-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := in.certs
	for key, file := range map[string]string{"ca.crt": "ca.crt", "tls.crt": "scheduler-client.crt",
		"tls.key": "scheduler-client.key"} {
		if len(s.Data[key]) == 0 {
			t.Fatalf("Secret %s/understory-scheduler-client-tls has no %s", nsSystem, key)
		}
		if err := os.WriteFile(filepath.Join(dir, file), s.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// secondSchedulerRuns: the second scheduler (components/second-scheduler) holds its
// own Lease in understory-system, the node's own kube-scheduler is left as it was (no
// extender), and the extender answers at its Service's fixed ClusterIP over TLS with
// the client certificate Helm issued, synced and leading.
func (in *install) secondSchedulerRuns(t *testing.T) {
	ctx, n := in.ctx, in.n
	var holder string
	err := poll(ctx, 60*time.Second, func() (bool, error) {
		l, err := n.client.CoordinationV1().Leases(nsSystem).Get(ctx, secondScheduler, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *l.Spec.HolderIdentity
		return strings.HasPrefix(holder, secondScheduler+"-"), nil
	})
	if err != nil {
		t.Fatalf("Lease %s/%s: holder %q, want one of the %s pods: %v", nsSystem, secondScheduler, holder,
			secondScheduler, err)
	}
	svc, err := n.client.CoreV1().Services(nsSystem).Get(ctx, extenderName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip := svc.Spec.ClusterIP
	in.ext = newExtenderClient(t, in.certs, ip)
	var st = struct {
		synced  bool
		refused string
	}{}
	err = poll(ctx, 60*time.Second, func() (bool, error) {
		s, err := in.ext.status(ctx)
		if err != nil {
			return false, nil
		}
		st.synced, st.refused = s.Synced, s.BindsRefused
		return s.Synced && s.BindsRefused == "", nil
	})
	if err != nil {
		t.Fatalf("extender at https://%s:%d (%s): synced %v, bindsRefused %q: %v", ip, extenderPort, extenderServer,
			st.synced, st.refused, err)
	}
	t.Logf("second scheduler leading as %s (Lease %s/%s); extender at https://%s:%d (serverName %s) synced", holder,
		nsSystem, secondScheduler, ip, extenderPort, extenderServer)
}

// scheduledBy returns who reported pod ns/name Scheduled (controlplane.ScheduledBy),
// waiting for the event.
func (in *install) scheduledBy(t *testing.T, ns, name string) []string {
	t.Helper()
	var got []string
	err := poll(in.ctx, 30*time.Second, func() (bool, error) {
		by, err := controlplane.ScheduledBy(in.ctx, in.n.client, ns, name)
		got = by
		return err == nil && len(by) > 0, nil
	})
	if err != nil {
		t.Errorf("pod %s/%s: no Scheduled event: %v", ns, name, err)
	}
	return got
}
