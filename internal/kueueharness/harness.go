package kueueharness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
)

// Version is the Kueue release the harness runs (scripts/kueue.sh builds it).
const Version = "v0.17.0"

// Namespace is where the manager keeps its webhook Secret (its Configuration's
// namespace).
const Namespace = "kueue-system"

// ConfigRelPath is the Kueue Configuration Understory ships, relative to the module
// root.
const ConfigRelPath = "manifests/components/kueue/kueue-config.yaml"

const buildScript = "scripts/kueue.sh"

// Group is Kueue's API group; the harness and tests use its storage version.
const Group = "kueue.x-k8s.io"

// GVR returns the v1beta2 resource of Kueue kind plural (clusterqueues, workloads, ...).
func GVR(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: "v1beta2", Resource: resource}
}

// ErrConfig marks a Kueue Configuration the harness cannot use.
var ErrConfig = errors.New("unusable Kueue configuration")

// Bin is a built Kueue: the manager and the CRDs of the same release.
type Bin struct {
	Manager string // the kueue binary
	CRDs    string // crds.yaml
}

// Find returns the Kueue build in $UNDERSTORY_KUEUE_BIN or
// $UNDERSTORY_CACHE/kueue-v0.17.0/bin (default cache root ~/.cache/understory).
// When missing it runs scripts/kueue.sh under CI=true or UNDERSTORY_BUILD_KUEUE=1
// (failing the test when that fails) and skips the test otherwise, naming the
// command to run.
func Find(t testing.TB) Bin {
	t.Helper()
	dir := binDir()
	b := Bin{Manager: filepath.Join(dir, "kueue"), CRDs: filepath.Join(dir, "crds.yaml")}
	if b.present() {
		return b
	}
	if os.Getenv("CI") != "true" && os.Getenv("UNDERSTORY_BUILD_KUEUE") != "1" {
		t.Skipf("Kueue %s not found in %s; build it once with `%s` (~11 min of CPU cold, ~20 min on 2 busy cores), or set UNDERSTORY_BUILD_KUEUE=1 to build from the test", Version, dir, buildScript)
	}
	script, err := findUp(buildScript)
	if err != nil {
		t.Fatalf("Kueue missing and cannot build it: %v", err)
	}
	var out bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), "UNDERSTORY_KUEUE_BIN="+dir)
	cmd.Stdout = io.MultiWriter(os.Stderr, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s failed: %v\n%s", script, err, controlplane.TailLines(out.String(), 40))
	}
	if !b.present() {
		t.Fatalf("%s ran but %s is incomplete", script, dir)
	}
	return b
}

func (b Bin) present() bool {
	fi, err := os.Stat(b.Manager)
	if err != nil || fi.Mode()&0o111 == 0 {
		return false
	}
	fi, err = os.Stat(b.CRDs)
	return err == nil && fi.Size() > 0
}

func binDir() string {
	if d := os.Getenv("UNDERSTORY_KUEUE_BIN"); d != "" {
		return d
	}
	root := os.Getenv("UNDERSTORY_CACHE")
	if root == "" {
		home, _ := os.UserHomeDir()
		root = filepath.Join(home, ".cache", "understory")
	}
	return filepath.Join(root, "kueue-"+Version, "bin")
}

// findUp is rel (relative to the module root) below the module root.
func findUp(rel string) (string, error) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, rel)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("finding %s: %w", rel, err)
	}
	return p, nil
}

// ReadConfig reads ConfigRelPath from the module root.
func ReadConfig() ([]byte, error) {
	p, err := findUp(ConfigRelPath)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

// conversionCRDs are the CRDs whose conversion webhook Kueue's certificate rotator
// fills and waits for (pkg/util/cert of Kueue v0.17.0).
var conversionCRDs = map[string]bool{
	"localqueues.kueue.x-k8s.io":        true,
	"clusterqueues.kueue.x-k8s.io":      true,
	"workloads.kueue.x-k8s.io":          true,
	"cohorts.kueue.x-k8s.io":            true,
	"multikueueclusters.kueue.x-k8s.io": true,
}

// Webhook is the port the manager's webhook server will listen on: InstallCRDs
// names it in the CRDs' conversion webhooks, Start serves on it.
type Webhook struct{ Port int }

// InstallCRDs installs every CRD of b (waiting until each is served) and returns the
// webhook port the conversion webhooks point at, for Start.
func InstallCRDs(ctx context.Context, t testing.TB, cp *controlplane.ControlPlane, b Bin) Webhook {
	t.Helper()
	raw, err := os.ReadFile(b.CRDs)
	if err != nil {
		t.Fatalf("kueue CRDs: %v", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := withConversionWebhooks(raw, ports[0])
	if err != nil {
		t.Fatalf("kueue CRDs: %v", err)
	}
	if _, err := cp.InstallCRD(ctx, manifest); err != nil {
		t.Fatalf("kueue CRDs: %v", err)
	}
	return Webhook{Port: ports[0]}
}

// withConversionWebhooks returns the CRD stream raw with a Webhook conversion
// (clientConfig.url on 127.0.0.1:port) on each of conversionCRDs, as JSON documents.
func withConversionWebhooks(raw []byte, port int) ([]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading CRDs: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("decoding a CRD: %w", err)
		}
		if obj == nil {
			continue
		}
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if conversionCRDs[name] {
			spec, ok := obj["spec"].(map[string]any)
			if !ok {
				return nil, fmt.Errorf("CRD %s has no spec", name)
			}
			spec["conversion"] = map[string]any{
				"strategy": "Webhook",
				"webhook": map[string]any{
					"conversionReviewVersions": []any{"v1"},
					"clientConfig": map[string]any{
						"url": fmt.Sprintf("https://127.0.0.1:%d/convert", port),
					},
				},
			}
		}
		js, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		docs = append(docs, js)
	}
	if len(docs) == 0 {
		return nil, errors.New("no CRDs")
	}
	return bytes.Join(docs, []byte("\n---\n")), nil
}

// Options configure Start.
type Options struct {
	// Config is the Kueue Configuration (YAML) the harness's own keys are laid
	// over; nil: ReadConfig().
	Config []byte
	// PodsReadyTimeout, when set, replaces waitForPodsReady.timeout (the shipped
	// 5 min is too long for a test).
	PodsReadyTimeout time.Duration
	// BackoffBaseSeconds, when set, replaces
	// waitForPodsReady.requeuingStrategy.backoffBaseSeconds.
	BackoffBaseSeconds int32
	// StartTimeout bounds the wait for /readyz (default 90 s).
	StartTimeout time.Duration
	// GroupKindConcurrency, when set, overrides controller.groupKindConcurrency per
	// kind (workers per controller; see InstallConcurrency).
	GroupKindConcurrency map[string]int
}

// InstallConcurrency is controller.groupKindConcurrency of the Configuration
// Kueue's own install ships (v0.17.0, config/components/manager/
// controller_manager_config.yaml). Configuration lays it under a Configuration
// without a controller section, as merging Understory's keys into Kueue's file
// would: without it every controller runs one worker (controller-runtime's
// default), and admitted Jobs waited 40 s for the Job reconciler to unsuspend them
// in a 300-node cluster benchmark.
func InstallConcurrency() map[string]int {
	return map[string]int{
		"Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 5, "LocalQueue.kueue.x-k8s.io": 1,
		"Cohort.kueue.x-k8s.io": 1, "ClusterQueue.kueue.x-k8s.io": 1, "ResourceFlavor.kueue.x-k8s.io": 1,
	}
}

// Kueue is a running manager.
type Kueue struct {
	logPath    string
	configPath string
	healthURL  string
	cmd        *exec.Cmd
	done       chan struct{}
	waitErr    error
	stopOnce   sync.Once
}

// LogPath is the manager's log file.
func (k *Kueue) LogPath() string { return k.logPath }

// ConfigPath is the Configuration file the manager runs with.
func (k *Kueue) ConfigPath() string { return k.configPath }

// Pid is the manager's process id (for measuring its CPU and memory in /proc).
func (k *Kueue) Pid() int { return k.cmd.Process.Pid }

// Start runs Kueue's manager against cp (see the package doc) and waits until it
// is ready. The webhook port comes from InstallCRDs.
func Start(ctx context.Context, t testing.TB, cp *controlplane.ControlPlane, b Bin, wh Webhook, opts Options) *Kueue {
	t.Helper()
	if opts.Config == nil {
		c, err := ReadConfig()
		if err != nil {
			t.Fatal(err)
		}
		opts.Config = c
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 90 * time.Second
	}
	if err := cp.CreateNamespace(ctx, Namespace); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kueue-webhook-server-cert", Namespace: Namespace}}
	if _, err := cp.Client().CoreV1().Secrets(Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Configuration(opts, wh.Port, ports[0], ports[1], filepath.Join(dir, "certs"))
	if err != nil {
		t.Fatal(err)
	}
	k := &Kueue{
		logPath:    filepath.Join(dir, "kueue.log"),
		configPath: filepath.Join(dir, "config.yaml"),
		healthURL:  "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		done:       make(chan struct{}),
	}
	if err := os.WriteFile(k.configPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(k.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	k.cmd = exec.Command(b.Manager, "--config="+k.configPath, "--kubeconfig="+cp.Kubeconfig(), "--zap-log-level=2")
	k.cmd.Stdout, k.cmd.Stderr = f, f
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := k.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting kueue: %v", err)
	}
	go func() {
		k.waitErr = k.cmd.Wait()
		f.Close()
		close(k.done)
	}()
	t.Cleanup(func() {
		k.Stop()
		if t.Failed() {
			t.Logf("----- last lines of kueue (%s) -----\n%s", k.logPath, controlplane.TailFile(k.logPath, 80))
		}
	})
	// Kueue's certificate rotator writes the Secret and waits for its files in
	// certDir, which a kubelet would project: do that here.
	mountCtx, stopMount := context.WithCancel(ctx)
	mounted := make(chan struct{})
	go func() {
		defer close(mounted)
		mountSecret(mountCtx, cp.Client(), secret.Name, filepath.Join(dir, "certs"))
	}()
	t.Cleanup(func() { stopMount(); <-mounted })
	if err := k.waitReady(ctx, opts.StartTimeout); err != nil {
		t.Fatalf("kueue: %v\n%s", err, controlplane.TailFile(k.logPath, 60))
	}
	return k
}

// mountSecret copies the data of Secret name (Namespace) into files of dir, as a
// kubelet projects a Secret volume, until ctx ends: each key that changed is
// written to a temp file and renamed.
func mountSecret(ctx context.Context, c kubernetes.Interface, name, dir string) {
	written := map[string][]byte{}
	for ctx.Err() == nil {
		if s, err := c.CoreV1().Secrets(Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
			for key, val := range s.Data {
				if bytes.Equal(written[key], val) || strings.ContainsAny(key, "/\\") {
					continue
				}
				if err := os.MkdirAll(dir, 0o700); err != nil {
					return
				}
				tmp := filepath.Join(dir, "."+key+".tmp")
				if os.WriteFile(tmp, val, 0o600) == nil && os.Rename(tmp, filepath.Join(dir, key)) == nil {
					written[key] = val
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Configuration returns opts.Config with the harness's keys laid over it (see the
// package doc): webhook on 127.0.0.1:webhookPort with certDir, metrics on
// metricsPort, health on healthPort.
func Configuration(opts Options, webhookPort, metricsPort, healthPort int, certDir string) ([]byte, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(opts.Config, &cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg == nil || cfg["kind"] != "Configuration" || !strings.HasPrefix(fmt.Sprint(cfg["apiVersion"]), "config.kueue.x-k8s.io/") {
		return nil, fmt.Errorf("%w: not a config.kueue.x-k8s.io Configuration", ErrConfig)
	}
	cfg["namespace"] = Namespace
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	cfg["webhook"] = map[string]any{"host": "127.0.0.1", "port": webhookPort, "certDir": certDir}
	cfg["metrics"] = map[string]any{"bindAddress": net.JoinHostPort("127.0.0.1", strconv.Itoa(metricsPort))}
	cfg["health"] = map[string]any{"healthProbeBindAddress": net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort))}
	cfg["internalCertManagement"] = map[string]any{"enable": true}
	cfg["clientConnection"] = map[string]any{"qps": 200, "burst": 400}
	cfg["integrations"] = map[string]any{"frameworks": []any{"batch/job"}}
	ctl, _ := cfg["controller"].(map[string]any)
	if ctl == nil {
		gk := map[string]any{}
		for k, v := range InstallConcurrency() {
			gk[k] = v
		}
		ctl = map[string]any{"groupKindConcurrency": gk}
		cfg["controller"] = ctl
	}
	if len(opts.GroupKindConcurrency) > 0 {
		gk, _ := ctl["groupKindConcurrency"].(map[string]any)
		if gk == nil {
			gk = map[string]any{}
		}
		for k, v := range opts.GroupKindConcurrency {
			if v < 1 {
				return nil, fmt.Errorf("%w: groupKindConcurrency %s = %d, want at least 1", ErrConfig, k, v)
			}
			gk[k] = v
		}
		ctl["groupKindConcurrency"] = gk
	}
	fg, _ := cfg["featureGates"].(map[string]any)
	if fg == nil {
		fg = map[string]any{}
	}
	fg["VisibilityOnDemand"] = false
	cfg["featureGates"] = fg
	if opts.PodsReadyTimeout > 0 || opts.BackoffBaseSeconds > 0 {
		w, _ := cfg["waitForPodsReady"].(map[string]any)
		if w == nil {
			return nil, fmt.Errorf("%w: waitForPodsReady overrides given but the configuration has none", ErrConfig)
		}
		if opts.PodsReadyTimeout > 0 {
			w["timeout"] = opts.PodsReadyTimeout.String()
		}
		if opts.BackoffBaseSeconds > 0 {
			rs, _ := w["requeuingStrategy"].(map[string]any)
			if rs == nil {
				rs = map[string]any{}
			}
			rs["backoffBaseSeconds"] = opts.BackoffBaseSeconds
			w["requeuingStrategy"] = rs
		}
	}
	return yaml.Marshal(cfg)
}

func (k *Kueue) waitReady(ctx context.Context, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case <-k.done:
			return fmt.Errorf("exited during start-up: %v", k.waitErr)
		default:
		}
		resp, err := hc.Get(k.healthURL + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz: %s", resp.Status)
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Exited reports whether the manager has exited (it should not, while a test runs).
func (k *Kueue) Exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// Stop terminates the manager's process group: SIGTERM, SIGKILL after 5 s.
func (k *Kueue) Stop() {
	k.stopOnce.Do(func() {
		pgid := k.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-k.done:
		case <-time.After(5 * time.Second):
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-k.done
	})
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
