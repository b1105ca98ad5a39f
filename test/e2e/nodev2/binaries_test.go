package nodev2

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/test/e2e/nodev2/vm"
)

// realTestPackages are the packages whose real_*_test.go files hold the tests that
// write a real cgroup filesystem.
var realTestPackages = []string{"cgroups", "koordlet", "koordlet/signals"}

// realTestFunc finds a test function's name in a real_*_test.go file.
var realTestFunc = regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`)

// realTests returns the Test functions of pkg's real_*_test.go files (and *_real_test.go).
func realTests(t *testing.T, root, pkg string) []string {
	t.Helper()
	var names []string
	for _, pat := range []string{"real_test.go", "real_*_test.go", "*_real_test.go"} {
		files, err := filepath.Glob(filepath.Join(root, pkg, pat))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range realTestFunc.FindAllStringSubmatch(string(b), -1) {
				names = append(names, m[1])
			}
		}
	}
	sort.Strings(names)
	return names
}

// TestRealCgroupTestsOnV2 runs every real-cgroup test of cgroups/, koordlet/ and
// koordlet/signals, compiled here, inside the cgroup v2 + systemd VM as root with
// CI=true (a test that cannot run there fails rather than skips), and fails on any
// failure or skip.
func TestRealCgroupTestsOnV2(t *testing.T) {
	root := repoRoot(t)
	img := imageDir(t, root)
	payload := t.TempDir()
	runs := []string{"#!/bin/sh", "set -u", "export CI=true", "mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing"}
	// The kill loop runs the agent binary; in the guest there is no Go toolchain.
	agent := filepath.Join(payload, "koordlet")
	goBuild(t, root, "build", "-o", agent, "./cmd/koordlet")
	var all []string
	for _, pkg := range realTestPackages {
		names := realTests(t, root, pkg)
		if len(names) == 0 {
			t.Fatalf("%s: no real-cgroup tests found", pkg)
		}
		all = append(all, names...)
		bin := strings.ReplaceAll(pkg, "/", "-") + ".test"
		goBuild(t, root, "test", "-c", "-o", filepath.Join(payload, bin), "./"+pkg)
		runs = append(runs, fmt.Sprintf("echo '=== PACKAGE %s'; (cd /opt/understory && UNDERSTORY_KOORDLET_BIN=/opt/understory/koordlet ./%s -test.v -test.count=1 -test.timeout=15m -test.run '^(%s)$' 2>&1); echo \"=== EXIT %s $?\"",
			pkg, bin, strings.Join(names, "|"), pkg))
	}
	if err := os.WriteFile(filepath.Join(payload, "run-tests.sh"), []byte(strings.Join(runs, "\n")+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	g, err := vm.Start(ctx, t, vm.Config{ImageDir: img, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest up in %v", time.Since(start).Round(time.Second))
	info := g.MustRun(ctx, t, "uname -r; stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; readlink /proc/1/exe")
	t.Logf("guest: %s", info)
	if !strings.Contains(info, "cgroup2fs") || !strings.Contains(info, "systemd") {
		t.Fatalf("guest is not cgroup v2 under systemd: %s", info)
	}
	r, err := g.Run(ctx, "/opt/understory/run-tests.sh")
	if err != nil {
		t.Fatal(err)
	}
	out := r.Stdout + r.Stderr
	t.Logf("real-cgroup tests in the guest (%v):\n%s", time.Since(start).Round(time.Second), out)
	checkGoTestOutput(t, out, all)
}

// checkGoTestOutput fails t for every test that failed, was skipped or did not run,
// and for every package that exited non-zero.
func checkGoTestOutput(t *testing.T, out string, want []string) {
	t.Helper()
	result := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		for _, verdict := range []string{"PASS", "FAIL", "SKIP"} {
			if name, ok := strings.CutPrefix(line, "--- "+verdict+": "); ok {
				name, _, _ = strings.Cut(name, " ")
				result[name] = verdict
			}
		}
		if rest, ok := strings.CutPrefix(line, "=== EXIT "); ok && !strings.HasSuffix(rest, " 0") {
			t.Errorf("package %s", rest)
		}
	}
	for _, name := range want {
		switch v := result[name]; v {
		case "PASS":
		case "":
			t.Errorf("%s did not run in the guest", name)
		default:
			t.Errorf("%s: %s on cgroup v2 + systemd", name, v)
		}
	}
	for name, v := range result {
		if v == "SKIP" && strings.Contains(name, "/") {
			t.Errorf("%s: SKIP on cgroup v2 + systemd", name)
		}
	}
}

func goBuild(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// imageDir is the built node image, or the test skips (fails under CI=true) saying how
// to build it.
func imageDir(t *testing.T, root string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "the cgroup v2 node needs root (the image is built with debootstrap)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.SkipOrFailInCI(t, "no qemu-system-x86_64 (make nodev2-image installs it): %v", err)
	}
	dir, err := vm.ImageDir(root)
	if err != nil {
		testenv.SkipOrFailInCI(t, "%v (make nodev2-image builds it)", err)
	}
	return dir
}
