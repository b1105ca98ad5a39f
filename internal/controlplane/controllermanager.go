package controlplane

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// controllerManagerBin is the optional binary StartControllerManager runs; the
// build script makes it with `--with kube-controller-manager` (`make k8s-bins`).
const controllerManagerBin = "kube-controller-manager"

// DefaultControllers returns the controllers StartControllerManager runs
// unless WithControllers says otherwise: Deployments, their ReplicaSets, and
// the status of PodDisruptionBudgets. Everything else (garbage collection,
// namespaces, nodes, service accounts) stays off, as the package doc says.
func DefaultControllers() []string { return []string{"deployment", "replicaset", "disruption"} }

// controllerManagerUser is the identity bootstrap RBAC grants what the
// controller manager itself needs (token requests for the controllers'
// service accounts, delegated authentication).
const controllerManagerUser = "system:kube-controller-manager"

// ControllerManagerOption tunes StartControllerManager.
type ControllerManagerOption func(*controllerManagerOptions)

type controllerManagerOptions struct {
	controllers []string
	args        []string
}

// WithControllers replaces DefaultControllers() (kube-controller-manager's
// --controllers, e.g. "deployment", "replicaset", "job").
func WithControllers(names ...string) ControllerManagerOption {
	return func(o *controllerManagerOptions) { o.controllers = append([]string(nil), names...) }
}

// WithControllerManagerArgs appends flags to kube-controller-manager's
// command line (a repeated flag overrides an earlier one).
func WithControllerManagerArgs(args ...string) ControllerManagerOption {
	return func(o *controllerManagerOptions) { o.args = append(o.args, args...) }
}

// ControllerManager is a running kube-controller-manager.
type ControllerManager struct {
	proc *process
	url  string
}

// Stop stops the controller manager before the test ends (the test's cleanup
// also does). Safe to call more than once.
func (m *ControllerManager) Stop() { m.proc.stop() }

// LogPath is the controller manager's log file.
func (m *ControllerManager) LogPath() string { return m.proc.logPath }

// URL is the controller manager's https serving URL (/healthz, /metrics).
func (m *ControllerManager) URL() string { return m.url }

// StartControllerManager runs kube-controller-manager against the control
// plane and waits for its /healthz. It runs each controller with its own
// service account (--use-service-account-credentials, tokens from the
// TokenRequest API signed with the apiserver's service-account key), so the
// controllers get exactly what bootstrap RBAC grants them, as in a real
// cluster. Leader election is off. The binary is optional (see
// controllerManagerBin): outside CI the test is skipped when it is missing,
// under CI=true (or UNDERSTORY_BUILD_K8S=1) it is built, and the test fails
// naming it when that is impossible.
func (cp *ControlPlane) StartControllerManager(t testing.TB,
	opts ...ControllerManagerOption) *ControllerManager {
	t.Helper()
	o := controllerManagerOptions{controllers: DefaultControllers()}
	for _, f := range opts {
		f(&o)
	}
	if len(o.controllers) == 0 {
		t.Fatalf("kube-controller-manager: no controllers to run")
	}
	bin := findOptionalBinary(t, controllerManagerBin)
	kubeconfig := cp.path("controller-manager.kubeconfig")
	if err := cp.writeClientKubeconfig(kubeconfig, controllerManagerUser); err != nil {
		t.Fatalf("kube-controller-manager: %v", err)
	}
	m := &ControllerManager{}
	m.proc, m.url = cp.startServed(t, servedComponent{
		label: "kube-controller-manager", procName: controllerManagerBin, bin: bin,
		logFile: "kube-controller-manager.log", certStem: "controller-manager", readyPath: "/healthz",
		args: func(port int, certFile, keyFile string) []string {
			return append([]string{
				"--kubeconfig=" + kubeconfig,
				"--authentication-kubeconfig=" + kubeconfig,
				"--authorization-kubeconfig=" + kubeconfig,
				"--bind-address=127.0.0.1",
				"--secure-port=" + strconv.Itoa(port),
				"--tls-cert-file=" + certFile,
				"--tls-private-key-file=" + keyFile,
				"--leader-elect=false",
				"--use-service-account-credentials=true",
				"--service-account-private-key-file=" + cp.path(saKeyFile),
				"--root-ca-file=" + cp.path(caFile),
				"--controllers=" + strings.Join(o.controllers, ","),
				// The harness's admin client is not rate limited either; the
				// defaults (20/30) slow Deployments of many replicas.
				"--kube-api-qps=100",
				"--kube-api-burst=200",
				"--profiling=false",
				"--v=" + strconv.Itoa(cp.opts.Verbosity),
			}, o.args...)
		},
	})
	return m
}

// locateOptional returns the path of optional binary name in the bin dir, or
// an error naming it.
func (s settings) locateOptional(name string) (string, error) {
	p := filepath.Join(s.binDir, name)
	if !isExecutable(p) {
		return p, fmt.Errorf("%s: %w", p, errMissing)
	}
	return p, nil
}

// findOptionalBinary is findBinaries for a binary the build script makes only
// with --with name: it skips outside CI, and builds it (failing the test when
// that is impossible) under CI=true or UNDERSTORY_BUILD_K8S=1.
func findOptionalBinary(t testing.TB, name string) string {
	t.Helper()
	s := settingsFromEnv()
	p, err := s.locateOptional(name)
	if err == nil {
		return p
	}
	if !s.build {
		t.Skipf("%s not found (%v); build it once with `make k8s-bins` or `%s --with %s` "+
			"(~1-4 min with a warm Go build cache), or set UNDERSTORY_BUILD_K8S=1 to build from the test",
			name, err, buildScript, name)
	}
	script, serr := findScript()
	if serr != nil {
		t.Fatalf("%s not found (%v) and cannot build it: %v", name, err, serr)
	}
	t.Logf("%s not found (%v); running %s --with %s (slow when cold)", name, err, script, name)
	var out bytes.Buffer
	cmd := exec.Command("bash", script, "--with", name)
	cmd.Env = append(os.Environ(), "UNDERSTORY_K8S_BIN="+s.binDir)
	cmd.Stdout = io.MultiWriter(os.Stderr, &out)
	cmd.Stderr = cmd.Stdout
	if rerr := cmd.Run(); rerr != nil {
		t.Fatalf("%s --with %s failed: %v\n%s", script, name, rerr, TailLines(out.String(), 40))
	}
	if p, err = s.locateOptional(name); err != nil {
		t.Fatalf("%s --with %s ran but %s is still missing: %v", script, name, name, err)
	}
	return p
}
