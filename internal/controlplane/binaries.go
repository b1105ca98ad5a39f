package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// K8sVersion is the Kubernetes release the harness runs.
const K8sVersion = "v1.37.2"

// OldestSupported is the oldest Kubernetes minor release Understory supports
// (README, Install), proven by the e2e tests that run the harness with
// Options.EmulatedVersion set to it. K8sVersion's kube-apiserver emulates
// back to three minor releases.
const OldestSupported = "1.34"

// buildScript is the repo-relative script that builds the binaries.
const buildScript = "scripts/k8s-binaries.sh"

// binaries are the absolute paths of the programs the harness runs.
type binaries struct {
	apiserver string
	scheduler string
	etcd      string
}

// settings is what the harness reads from the environment. It is the only
// place in the package that looks at the environment (a test-only
// exception to "env only in main").
type settings struct {
	binDir string // UNDERSTORY_K8S_BIN or $UNDERSTORY_CACHE/k8s-<ver>/bin
	etcd   string // UNDERSTORY_ETCD, else etcd from PATH
	ci     bool   // CI=true: never skip
	build  bool   // CI=true or UNDERSTORY_BUILD_K8S=1: run the build script
}

func settingsFromEnv() settings {
	s := settings{binDir: os.Getenv("UNDERSTORY_K8S_BIN"), etcd: os.Getenv("UNDERSTORY_ETCD")}
	if s.binDir == "" {
		cache := os.Getenv("UNDERSTORY_CACHE")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				home = os.TempDir()
			}
			cache = filepath.Join(home, ".cache", "understory")
		}
		s.binDir = filepath.Join(cache, "k8s-"+K8sVersion, "bin")
	}
	s.ci = testenv.InCI()
	s.build = s.ci || os.Getenv("UNDERSTORY_BUILD_K8S") == "1"
	return s
}

var errMissing = errors.New("missing")

// locate returns the binaries, or an error naming what is missing.
func (s settings) locate() (binaries, error) {
	b := binaries{
		apiserver: filepath.Join(s.binDir, "kube-apiserver"),
		scheduler: filepath.Join(s.binDir, "kube-scheduler"),
		etcd:      s.etcd,
	}
	var missing []string
	for _, p := range []string{b.apiserver, b.scheduler} {
		if !isExecutable(p) {
			missing = append(missing, p)
		}
	}
	if b.etcd == "" {
		p, err := exec.LookPath("etcd")
		if err != nil {
			missing = append(missing, "etcd (Debian package etcd-server)")
		}
		b.etcd = p
	} else if !isExecutable(b.etcd) {
		missing = append(missing, b.etcd)
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("%s: %w", strings.Join(missing, ", "), errMissing)
	}
	return b, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// findBinaries locates the binaries, building them when allowed, and skips
// (outside CI) or fails the test when they cannot be had.
func findBinaries(t testing.TB) binaries {
	t.Helper()
	s := settingsFromEnv()
	b, err := s.locate()
	if err == nil {
		return b
	}
	if !s.build {
		t.Skipf("control-plane binaries not found (%v); build them once with `%s` (kube-apiserver %s from the Go module proxy, ~6-10 min cold on 2 cores), or set UNDERSTORY_BUILD_K8S=1 to build from the test", err, buildScript, K8sVersion)
	}
	s.runBuild(t, err)
	if b, err = s.locate(); err != nil {
		t.Fatalf("%s ran but binaries are still missing: %v", buildScript, err)
	}
	return b
}

// runBuild runs the build script (with --with extra, if given) because of
// missing, and fails the test when it fails.
func (s settings) runBuild(t testing.TB, missing error, extra ...string) {
	t.Helper()
	script, serr := findScript()
	if serr != nil {
		t.Fatalf("control-plane binaries not found (%v) and cannot build them: %v", missing, serr)
	}
	t.Logf("control-plane binaries not found (%v); running %s (slow when cold)", missing, script)
	var out bytes.Buffer
	args := []string{script}
	if len(extra) > 0 {
		args = append(args, "--with", strings.Join(extra, ","))
	}
	cmd := exec.Command("bash", args...)
	cmd.Env = append(os.Environ(), "UNDERSTORY_K8S_BIN="+s.binDir)
	// Progress goes to the test's stderr as it happens; the tail goes to
	// the failure message.
	cmd.Stdout = io.MultiWriter(os.Stderr, &out)
	cmd.Stderr = cmd.Stdout
	if rerr := cmd.Run(); rerr != nil {
		t.Fatalf("%s failed: %v\n%s", script, rerr, TailLines(out.String(), 40))
	}
}

// FindKubectl returns kubectl K8sVersion from the same cache as the control
// plane's binaries (`scripts/k8s-binaries.sh --with kubectl` builds it), for
// tests that apply manifests the way users do. Like Start it builds it when
// CI=true or UNDERSTORY_BUILD_K8S=1 and skips the test otherwise.
func FindKubectl(t testing.TB) string {
	t.Helper()
	s := settingsFromEnv()
	p := filepath.Join(s.binDir, "kubectl")
	if isExecutable(p) {
		return p
	}
	missing := fmt.Errorf("%s: %w", p, errMissing)
	if !s.build {
		t.Skipf("kubectl not found (%v); build it once with `%s --with kubectl` (~1 min after the control-plane "+
			"binaries), or set UNDERSTORY_BUILD_K8S=1 to build from the test", missing, buildScript)
	}
	s.runBuild(t, missing, "kubectl")
	if !isExecutable(p) {
		t.Fatalf("%s --with kubectl ran but %s is still missing", buildScript, p)
	}
	return p
}

// findScript walks up from the working directory (a package dir under
// go test) to the repo root holding the build script.
func findScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", buildScript, err)
	}
	for {
		p := filepath.Join(dir, buildScript)
		if isExecutable(p) || fileExists(p) {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s above the working directory: %w", buildScript, os.ErrNotExist)
		}
		dir = parent
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TailLines is the last n lines of s.
func TailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// HelmBinary returns the helm that scripts/helm.sh builds (make helm-bin), repo being
// the repository's root, or $UNDERSTORY_HELM when set. Without it the test skips (fails
// under CI=true) and says what to run.
func HelmBinary(t testing.TB, repo string) string {
	t.Helper()
	if p := os.Getenv("UNDERSTORY_HELM"); p != "" {
		return p
	}
	out, err := exec.Command(filepath.Join(repo, "scripts", "helm.sh"), "--print-bin-dir").Output()
	if err != nil {
		t.Fatalf("scripts/helm.sh --print-bin-dir: %v", err)
	}
	p := filepath.Join(strings.TrimSpace(string(out)), "helm")
	if !isExecutable(p) {
		testenv.SkipOrFailInCI(t, "helm not found at %s: run `make helm-bin` (make test does; ~15 min cold on "+
			"2 cores), or set UNDERSTORY_HELM", p)
	}
	return p
}
