package gpumock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHybridProcCgroup(t *testing.T) {
	t.Parallel()
	const path = "/kubepods/besteffort/pod1/abc"
	got := HybridProcCgroup(path)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if lines[len(lines)-1] != "0::/" {
		t.Errorf("last line %q, want the unified 0::/", lines[len(lines)-1])
	}
	for _, want := range []string{"5:memory:" + path, "7:cpu,cpuacct:" + path, "3:freezer:" + path, "4:rdma:/"} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("no line %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "%s") {
		t.Errorf("unsubstituted %%s in\n%s", got)
	}
}

func TestWriteProc(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "proc") // created by WriteProc
	if err := WriteProc(root, 4242, "0::/x\n"); err != nil {
		t.Fatal(err)
	}
	cg, err := os.ReadFile(filepath.Join(root, "4242", "cgroup"))
	if err != nil || string(cg) != "0::/x\n" {
		t.Errorf("cgroup %q, %v", cg, err)
	}
	stat, err := os.ReadFile(filepath.Join(root, "4242", "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(stat))
	if len(f) < 22 || f[0] != "4242" || f[1] != "(python3)" || f[21] != "4242" {
		t.Errorf("stat %q: want pid 4242, comm (python3), start time (field 22) 4242", stat)
	}
	if err := WriteProc(filepath.Join(root, "4242", "cgroup"), 1, ""); err == nil {
		t.Error("WriteProc below a regular file: no error")
	}
}
