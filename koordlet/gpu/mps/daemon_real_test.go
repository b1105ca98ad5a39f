package mps

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRealControlDaemon runs modes run and find against NVIDIA's own
// nvidia-cuda-mps-control where one is installed (a GPU machine); elsewhere it is
// skipped. No client connects: the daemon starts no server.
func TestRealControlDaemon(t *testing.T) {
	bin, err := exec.LookPath(DefaultControlBinary)
	if err != nil {
		t.Skipf("%s not installed: %v", DefaultControlBinary, err)
	}
	root := t.TempDir()
	cfg := Config{Mode: ModeRun, PipeDirectory: filepath.Join(root, "pipe"), LogDirectory: filepath.Join(root, "log"),
		ShmDirectory:  filepath.Join(root, "shm"),
		ControlBinary: bin, CheckPeriod: metav1.Duration{Duration: 200 * time.Millisecond}}
	find, err := New(Config{Mode: ModeFind, PipeDirectory: cfg.PipeDirectory, ControlBinary: bin}, nil)
	if err != nil {
		t.Fatal(err)
	}
	find.check(context.Background())
	if find.Ready() {
		t.Fatal("find: ready before any daemon ran")
	}
	r := start(t, cfg)
	waitFor(t, "the started daemon to answer", r.d.Ready)
	fi, err := os.Lstat(filepath.Join(cfg.PipeDirectory, controlSocket))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control: %v", fi.Mode())
	find.check(context.Background())
	if !find.Ready() {
		_, err := find.probe(context.Background())
		t.Fatalf("find: the agent's daemon does not answer: %v", err)
	}
	r.shutdown(t)
	find.check(context.Background())
	if find.Ready() {
		t.Fatal("find: a daemon still answers after the agent quit its own")
	}
	t.Logf("log:\n%s", r.log.String())
}
