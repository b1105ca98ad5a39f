package realnode

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"

	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
)

// TestInstallFromRegistry installs Understory as a user of a release does: `make
// release` and `make push` to a registry (here one this test serves on the loopback),
// then `helm install` of the pushed chart, on a real node that has none of the
// project's images: containerd pulls each one from the registry (its image ID names
// the registry), and the agent, the extender and the webhook become Ready.
func TestInstallFromRegistry(t *testing.T) {
	requireRealNode(t, installHow)
	repo := repoRoot(t)
	shim := filepath.Join(repo, "bin", "libunderstory-tsg.so")
	if _, err := os.Stat(shim); err != nil {
		testenv.SkipOrFailInCI(t, "%s is not built: run `make e2e-deps`", shim)
	}
	helm := controlplane.HelmBinary(t, repo)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	host := l.Addr().String()
	registry := host + "/understory"

	// make release && make push, as the README's install section says.
	bin, dist := t.TempDir(), filepath.Join(t.TempDir(), "dist")
	data, err := os.ReadFile(shim)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "libunderstory-tsg.so"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "DIST="+dist, "BIN="+bin, "REGISTRY="+registry, "INSECURE=1", "HELM="+helm,
		"KUBECTL="+controlplane.FindKubectl(t), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_CACHE_HOME="+t.TempDir())
	for _, script := range []string{"scripts/release.sh", "scripts/push.sh"} {
		start := time.Now()
		cmd := exec.CommandContext(ctx, script)
		cmd.Dir, cmd.Env = repo, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		t.Logf("%s: %v", script, time.Since(start).Round(time.Second))
	}
	var images []struct{ Name, Ref string }
	data, err = os.ReadFile(filepath.Join(dist, "images", "images.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &images); err != nil {
		t.Fatal(err)
	}
	_, tag, _ := strings.Cut(images[0].Ref, ":")

	// A node with only the pause and busybox images, pulling from the registry.
	n := startNodeWith(t, repo, []string{"--insecure-registry", host})
	out, err := n.helm(ctx, helm, "install", helmRelease, "oci://"+registry+"/charts/understory", "--version", tag,
		"--plain-http", "-n", nsSystem, "--create-namespace", "-f", filepath.Join(repo, realnodeValues),
		"--set", "secondScheduler.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "STATUS: deployed") {
		t.Fatalf("helm install: no STATUS: deployed in\n%s", out)
	}
	for _, w := range []struct{ selector, image string }{
		{agentLabel, "koordlet-nogpu"},
		{"app.kubernetes.io/name=understory-scheduler-extender", "scheduler-extender"},
		{"app.kubernetes.io/name=understory-admission", "admission"},
	} {
		p := n.readyPod(ctx, t, nsSystem, w.selector, "", 4*time.Minute)
		want := registry + "/" + w.image
		if c := p.Spec.Containers[0]; c.Image != want+":"+tag {
			t.Errorf("%s: image %s, want %s:%s", p.Name, c.Image, want, tag)
		}
		if cs := p.Status.ContainerStatuses; len(cs) == 0 || !strings.HasPrefix(cs[0].ImageID, want+"@sha256:") {
			t.Errorf("%s: image ID %v, want one pulled from %s", p.Name, statusImageIDs(p), want)
		}
		t.Logf("%s Ready, image %s pulled from the registry", p.Name, statusImageIDs(p))
	}
	events, err := n.client.CoreV1().Events(nsSystem).List(ctx, metav1.ListOptions{FieldSelector: "reason=Pulled"})
	if err != nil {
		t.Fatal(err)
	}
	pulled := 0
	for _, e := range events.Items {
		if strings.Contains(e.Message, "Successfully pulled image \""+registry+"/") {
			pulled++
		}
	}
	if pulled == 0 {
		t.Errorf("no Pulled event names the registry (%d Pulled events): the images did not come from it", len(events.Items))
	}
}

func statusImageIDs(p *corev1.Pod) []string {
	var ids []string
	for _, cs := range p.Status.ContainerStatuses {
		ids = append(ids, cs.ImageID)
	}
	return ids
}
