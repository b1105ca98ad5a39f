package controlplane

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/internal/testenv"
)

func TestCompleteSchedulerConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		opts    schedulerOptions
		wantErr bool
		check   func(t *testing.T, cfg map[string]any)
	}{
		{name: "empty gets type and harness fields", in: "", check: func(t *testing.T, cfg map[string]any) {
			if cfg["apiVersion"] != schedulerAPIVersion || cfg["kind"] != schedulerKind {
				t.Errorf("type = %v %v", cfg["apiVersion"], cfg["kind"])
			}
		}},
		{name: "profiles pass through", in: "profiles:\n- schedulerName: other\n", check: func(t *testing.T, cfg map[string]any) {
			p, _ := cfg["profiles"].([]any)
			if len(p) != 1 || p[0].(map[string]any)["schedulerName"] != "other" {
				t.Errorf("profiles = %v", cfg["profiles"])
			}
		}},
		{name: "client rate", in: "clientConnection: {qps: 1}\n", opts: schedulerOptions{qps: 5000, burst: 6000}, check: func(t *testing.T, cfg map[string]any) {
			c := cfg["clientConnection"].(map[string]any)
			if c["qps"] != float64(5000) || c["burst"] != float64(6000) {
				t.Errorf("clientConnection = %v", c)
			}
		}},
		{name: "caller rate kept without option", in: "clientConnection: {qps: 7, kubeconfig: /elsewhere}\n", check: func(t *testing.T, cfg map[string]any) {
			if c := cfg["clientConnection"].(map[string]any); c["qps"] != float64(7) {
				t.Errorf("clientConnection = %v", c)
			}
		}},
		{name: "leader election forced off", in: "leaderElection: {leaderElect: true, resourceName: x}\n", check: func(t *testing.T, cfg map[string]any) {
			if le := cfg["leaderElection"].(map[string]any); le["resourceName"] != "x" {
				t.Errorf("leaderElection = %v", le)
			}
		}},
		{name: "leader election kept on request", in: "leaderElection: {resourceNamespace: ns, resourceName: x}\n",
			opts: schedulerOptions{leaderElection: true}, check: func(t *testing.T, cfg map[string]any) {
				if le := cfg["leaderElection"].(map[string]any); le["resourceName"] != "x" || le["resourceNamespace"] != "ns" {
					t.Errorf("leaderElection = %v", le)
				}
			}},
		{name: "wrong apiVersion", in: "apiVersion: kubescheduler.config.k8s.io/v1beta3\n", wantErr: true},
		{name: "wrong kind", in: "kind: KubeletConfiguration\n", wantErr: true},
		{name: "clientConnection not a mapping", in: "clientConnection: [1]\n", wantErr: true},
		{name: "leaderElection not a mapping", in: "leaderElection: yes\n", wantErr: true},
		{name: "not yaml", in: "{", wantErr: true},
		{name: "not a mapping", in: "- a\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := completeSchedulerConfig(tc.in, "/k/config", tc.opts)
			if tc.wantErr {
				if !errors.Is(err, ErrSchedulerConfig) {
					t.Fatalf("err = %v, want ErrSchedulerConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg := map[string]any{}
			if err := yaml.Unmarshal(out, &cfg); err != nil {
				t.Fatal(err)
			}
			if c := cfg["clientConnection"].(map[string]any); c["kubeconfig"] != "/k/config" {
				t.Errorf("kubeconfig = %v, want /k/config", c["kubeconfig"])
			}
			if le := cfg["leaderElection"].(map[string]any); le["leaderElect"] != tc.opts.leaderElection {
				t.Errorf("leaderElect = %v, want %v", le["leaderElect"], tc.opts.leaderElection)
			}
			tc.check(t, cfg)
		})
	}
}

func FuzzCompleteSchedulerConfig(f *testing.F) {
	f.Add("")
	f.Add("profiles:\n- schedulerName: x\n")
	f.Add("clientConnection: 3\n")
	f.Add("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders: [{urlPrefix: http://127.0.0.1:1}]\n")
	f.Fuzz(func(t *testing.T, in string) {
		out, err := completeSchedulerConfig(in, "/k", schedulerOptions{qps: 1, burst: 1})
		if err != nil {
			return
		}
		cfg := map[string]any{}
		if err := yaml.Unmarshal(out, &cfg); err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, out)
		}
		if c, _ := cfg["clientConnection"].(map[string]any); c["kubeconfig"] != "/k" {
			t.Fatalf("kubeconfig not set: %s", out)
		}
	})
}

func TestSchedulerConfig(t *testing.T) {
	t.Parallel()
	s, err := SchedulerConfig(Extender{URLPrefix: "http://127.0.0.1:9", FilterVerb: "filter", PrioritizeVerb: "prioritize", Weight: 2, NodeCacheCapable: true})
	if err != nil {
		t.Fatal(err)
	}
	out, err := completeSchedulerConfig(s, "/k", schedulerOptions{})
	if err != nil {
		t.Fatalf("SchedulerConfig output rejected: %v\n%s", err, s)
	}
	var cfg struct {
		Extenders []Extender `json:"extenders"`
	}
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	want := Extender{URLPrefix: "http://127.0.0.1:9", FilterVerb: "filter", PrioritizeVerb: "prioritize", Weight: 2, NodeCacheCapable: true}
	if len(cfg.Extenders) != 1 || cfg.Extenders[0].URLPrefix != want.URLPrefix || cfg.Extenders[0].Weight != 2 || !cfg.Extenders[0].NodeCacheCapable {
		t.Errorf("extenders = %+v, want [%+v]", cfg.Extenders, want)
	}
	plain, err := SchedulerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain, "extenders") {
		t.Errorf("no-extender config mentions extenders:\n%s", plain)
	}
}

func TestDecodeCRDs(t *testing.T) {
	t.Parallel()
	const other = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
	tests := []struct {
		name     string
		manifest string
		want     int
		wantErr  error
	}{
		{name: "podgroups", manifest: string(PodGroupCRD()), want: 1},
		{name: "two with empty docs", manifest: "---\n" + string(PodGroupCRD()) + "\n---\n---\n" + strings.Replace(string(PodGroupCRD()), "podgroups.scheduling", "others.scheduling", 1), want: 2},
		{name: "not a CRD", manifest: other, wantErr: ErrNotCRD},
		{name: "CRD then not a CRD", manifest: string(PodGroupCRD()) + "\n---\n" + other, wantErr: ErrNotCRD},
		{name: "empty", manifest: "", wantErr: ErrNotCRD},
		{name: "garbage", manifest: "{{{", wantErr: errAny},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := decodeCRDs([]byte(tc.manifest))
			switch {
			case tc.wantErr == errAny:
				if err == nil {
					t.Fatal("no error")
				}
				return
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if len(got) != tc.want {
				t.Fatalf("%d CRDs, want %d", len(got), tc.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestPodGroupCRDResource(t *testing.T) {
	t.Parallel()
	crds, err := decodeCRDs(PodGroupCRD())
	if err != nil {
		t.Fatal(err)
	}
	gvr, namespaced, err := crdResource(crds[0])
	if err != nil {
		t.Fatal(err)
	}
	if gvr != PodGroupGVR() || !namespaced {
		t.Errorf("resource = %v namespaced=%v, want %v namespaced", gvr, namespaced, PodGroupGVR())
	}
}

func FuzzDecodeCRDs(f *testing.F) {
	f.Add(PodGroupCRD())
	f.Add([]byte("---\n---\n"))
	f.Add([]byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","spec":{"versions":[1]}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		crds, err := decodeCRDs(in)
		if err != nil {
			return
		}
		for _, c := range crds {
			_, _, _ = crdResource(c) // must not panic on any shape
		}
	})
}

func TestNewNode(t *testing.T) {
	t.Parallel()
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
	n := NewNode("n1", capacity, map[string]string{"understory.io/pool": "a", corev1.LabelOSStable: "linux"})
	if _, ok := capacity[corev1.ResourcePods]; ok {
		t.Error("NewNode modified the caller's capacity")
	}
	if got := n.Status.Capacity[corev1.ResourcePods]; got.Value() != defaultPodsPerNode {
		t.Errorf("pods capacity = %v, want %d", got.String(), defaultPodsPerNode)
	}
	for name, q := range n.Status.Capacity {
		if a := n.Status.Allocatable[name]; a.Cmp(q) != 0 {
			t.Errorf("allocatable %s = %v, capacity %v", name, a.String(), q.String())
		}
	}
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
		} else if c.Status != corev1.ConditionFalse {
			t.Errorf("condition %s = %s, want False", c.Type, c.Status)
		}
	}
	if !ready {
		t.Error("node is not Ready")
	}
	for k, v := range map[string]string{corev1.LabelHostname: "n1", "understory.io/pool": "a", corev1.LabelArchStable: "amd64"} {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if len(n.Spec.Taints) != 0 || n.Spec.Unschedulable {
		t.Errorf("node is tainted or unschedulable: %+v", n.Spec)
	}
}

func TestParallel(t *testing.T) {
	t.Parallel()
	t.Run("every index once", func(t *testing.T) {
		t.Parallel()
		hits := make([]atomic.Int32, 500)
		if err := parallel(context.Background(), len(hits), func(_ context.Context, i int) error {
			hits[i].Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for i := range hits {
			if h := hits[i].Load(); h != 1 {
				t.Fatalf("index %d ran %d times", i, h)
			}
		}
	})
	t.Run("first error stops the rest", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("boom")
		var ran atomic.Int32
		err := parallel(context.Background(), 100000, func(ctx context.Context, i int) error {
			ran.Add(1)
			if i == 3 {
				return boom
			}
			return ctx.Err()
		})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want boom", err)
		}
		if ran.Load() == 100000 {
			t.Error("all items ran despite the error")
		}
	})
	t.Run("zero items", func(t *testing.T) {
		t.Parallel()
		if err := parallel(context.Background(), 0, func(context.Context, int) error { return errors.New("called") }); err != nil {
			t.Fatal(err)
		}
	})
}

func TestFreePorts(t *testing.T) {
	t.Parallel()
	ports, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("bad or repeated port %d in %v", p, ports)
		}
		seen[p] = true
	}
}

func TestPKIIssue(t *testing.T) {
	t.Parallel()
	ca, err := newPKI()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	tests := []struct {
		req   certRequest
		usage x509.ExtKeyUsage
		host  string
	}{
		{req: certRequest{commonName: "srv", dnsNames: []string{"localhost"}, server: true}, usage: x509.ExtKeyUsageServerAuth, host: "localhost"},
		{req: certRequest{commonName: "admin", orgs: []string{"system:masters"}}, usage: x509.ExtKeyUsageClientAuth},
	}
	for _, tc := range tests {
		certPEM, keyPEM, err := ca.issue(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(certPEM)
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: tc.host, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
			t.Errorf("%s: %v", tc.req.commonName, err)
		}
		if cert.Subject.CommonName != tc.req.commonName || len(cert.Subject.Organization) != len(tc.req.orgs) {
			t.Errorf("subject = %v", cert.Subject)
		}
		if kb, _ := pem.Decode(keyPEM); kb == nil || kb.Type != "EC PRIVATE KEY" {
			t.Errorf("%s: key PEM is not an EC private key", tc.req.commonName)
		}
	}
}

func TestSweepStaleTmpfs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := dead.ProcessState.Pid()
	dirs := map[string]bool{ // name -> kept
		tmpfsPrefix + strconv.Itoa(os.Getpid()) + "-a": true,
		tmpfsPrefix + strconv.Itoa(deadPID) + "-b":     false,
		tmpfsPrefix + "notapid-c":                      true,
		"someone-else-" + strconv.Itoa(deadPID):        true,
	}
	for d := range dirs {
		if err := os.Mkdir(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	sweepStaleTmpfs(root)
	for d, kept := range dirs {
		if _, err := os.Stat(filepath.Join(root, d)); (err == nil) != kept {
			t.Errorf("%s: exists=%v, want %v", d, err == nil, kept)
		}
	}
}

func TestProcessStopKillsGroup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		script string
		sleeps int // the script's sleep children, all started once its setup is done
	}{
		{name: "exits on SIGTERM", script: "sleep 300 & wait", sleeps: 1},
		{name: "ignores SIGTERM", script: "trap '' TERM; sleep 300 & sleep 300", sleeps: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := startProcess("sh", filepath.Join(t.TempDir(), "sh.log"), "/bin/sh", []string{"-c", tc.script})
			if err != nil {
				t.Fatal(err)
			}
			p.grace = 200 * time.Millisecond
			t.Cleanup(p.stop)
			pgid := p.cmd.Process.Pid
			// The children have started (and the trap is set) before stop sends SIGTERM.
			testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d sleep children in process group %d", tc.sleeps, pgid),
				func() bool { return groupMembers(t, pgid, "sleep") == tc.sleeps })
			p.stop()
			p.stop() // idempotent
			if ok, _ := p.exited(); !ok {
				t.Fatal("leader still running after stop")
			}
			if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("process group %d still has members (kill 0: %v)", pgid, err)
			}
		})
	}
}

// groupMembers counts the processes of process group pgid that run comm.
func groupMembers(t *testing.T, pgid int, comm string) int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) && s[open+1:end] == comm {
			n++
		}
	}
	return n
}

func TestProcessWaitReadyReportsExit(t *testing.T) {
	t.Parallel()
	p, err := startProcess("false", filepath.Join(t.TempDir(), "false.log"), "/bin/sh", []string{"-c", "echo bad flag; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	err = p.waitReady(10*time.Second, func() error { return errors.New("not yet") })
	if !errors.Is(err, errExited) {
		t.Fatalf("err = %v, want errExited", err)
	}
	if tail := p.tail(5); !strings.Contains(tail, "bad flag") {
		t.Errorf("log tail %q lacks the process output", tail)
	}
}

func TestLocateReportsMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := settings{binDir: dir, etcd: filepath.Join(dir, "etcd")}
	_, err := s.locate()
	if !errors.Is(err, errMissing) {
		t.Fatalf("err = %v, want errMissing", err)
	}
	for _, name := range []string{"kube-apiserver", "kube-scheduler", "etcd"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
	for _, name := range []string{"kube-apiserver", "kube-scheduler", "etcd"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := s.locate()
	if err != nil {
		t.Fatal(err)
	}
	if b.apiserver != filepath.Join(dir, "kube-apiserver") || b.etcd != filepath.Join(dir, "etcd") {
		t.Errorf("binaries = %+v", b)
	}
}

func TestLocateOptionalReportsMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := settings{binDir: dir}
	if _, err := s.locateOptional(controllerManagerBin); !errors.Is(err, errMissing) ||
		!strings.Contains(err.Error(), controllerManagerBin) {
		t.Fatalf("err = %v, want errMissing naming %s", err, controllerManagerBin)
	}
	want := filepath.Join(dir, controllerManagerBin)
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.locateOptional(controllerManagerBin); !errors.Is(err, errMissing) {
		t.Fatalf("non-executable file: err = %v, want errMissing", err)
	}
	if err := os.Chmod(want, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := s.locateOptional(controllerManagerBin); err != nil || got != want {
		t.Fatalf("locateOptional = %q, %v; want %q", got, err, want)
	}
}

// TestControllerManager runs kube-controller-manager's default controllers on a real
// control plane: a Deployment gets its ReplicaSet and pod, with no RBAC denial.
func TestControllerManager(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real control plane; skipped in -short mode")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cp := Start(ctx, t, Options{})
	m := cp.StartControllerManager(t)
	replicas := int32(1)
	labels := map[string]string{"app": "cm-test"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-test", Namespace: metav1.NamespaceDefault},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       NewPod("", "", nil).Spec,
			},
		},
	}
	deps := cp.Client().AppsV1().Deployments(dep.Namespace)
	if _, err := deps.Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true,
		func(ctx context.Context) (bool, error) {
			pods, err := cp.Client().CoreV1().Pods(dep.Namespace).List(ctx,
				metav1.ListOptions{LabelSelector: "app=cm-test"})
			return err == nil && len(pods.Items) == 1, nil
		})
	if err != nil {
		t.Fatalf("Deployment %s got no pod from kube-controller-manager: %v", dep.Name, err)
	}
	// Each controller runs as its own service account: a denial means bootstrap RBAC
	// and the harness's identities or token signing do not fit together.
	b, err := os.ReadFile(m.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if i := strings.Index(string(b), " is forbidden"); i >= 0 {
		t.Errorf("kube-controller-manager was denied: %s", TailLines(string(b[:i+len(" is forbidden")]), 1))
	}
}

// TestK8sVersionIsTheScripts: the harness runs the version scripts/k8s-binaries.sh
// builds (and the real node runs, scripts/realnode/lib.sh reads it there).
func TestK8sVersionIsTheScripts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../" + buildScript)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "K8S_VERSION="); ok {
			if v != K8sVersion {
				t.Fatalf("%s builds %s, the harness expects %s", buildScript, v, K8sVersion)
			}
			return
		}
	}
	t.Fatalf("no K8S_VERSION= in %s", buildScript)
}
