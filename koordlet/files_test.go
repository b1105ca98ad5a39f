package koordlet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
)

// openFilesUnder lists this process's file descriptors open on a file below dir.
func openFilesUnder(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, dir+"/") {
			out = append(out, fd.Name()+" -> "+target)
		}
	}
	return out
}

// The agent closes the node's /proc/stat it opened, whether New fails after opening
// it or the agent shuts down: nothing is left for the garbage collector to find.
func TestAgentClosesProcStat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		newErr bool // the tier's path is a file: New fails after opening /proc/stat
	}{
		{"new fails", true},
		{"shutdown", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kind := cgroupstest.V2
			root := cgroupstest.NewRoot(t, kind)
			if tc.newErr {
				cgroupstest.AddGroup(t, root, kind, "kubepods")
				if err := os.WriteFile(filepath.Join(root, "kubepods", "understory-batch"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				cgroupstest.AddGroup(t, root, kind, "kubepods/understory-batch")
			}
			procRoot := t.TempDir()
			stat, err := os.ReadFile("/proc/stat")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(procRoot, "stat"), stat, 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := config.Default()
			cfg.CgroupRoot, cfg.ProcRoot, cfg.Signals.Mode = root, procRoot, string(signals.ModeSampling)
			a, err := New(cfg, Deps{Pods: newFakePods(), Registry: prometheus.NewRegistry()})
			if (err != nil) != tc.newErr {
				t.Fatalf("New: %v, want an error: %v", err, tc.newErr)
			}
			if a != nil {
				a.shutdown()
			}
			if open := openFilesUnder(t, procRoot); len(open) != 0 {
				t.Errorf("still open after %s: %v", tc.name, open)
			}
		})
	}
}
