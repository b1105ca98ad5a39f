package psi

import (
	"errors"
	"testing"
)

func TestPaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		got     func() (string, error)
		want    string
		wantErr error
	}{
		{"node cpu", func() (string, error) { return ProcFile("/host/proc", CPU) }, "/host/proc/pressure/cpu", nil},
		{"node bad resource", func() (string, error) { return ProcFile("/proc", "../stat") }, "", ErrInvalid},
		{"hybrid pod", func() (string, error) {
			return CgroupFile("/sys/fs/cgroup/unified", "kubepods/burstable/podabc", CPU)
		}, "/sys/fs/cgroup/unified/kubepods/burstable/podabc/cpu.pressure", nil},
		{"v2 root group", func() (string, error) { return CgroupFile("/sys/fs/cgroup", "", Memory) },
			"/sys/fs/cgroup/memory.pressure", nil},
		{"escaping path", func() (string, error) { return CgroupFile("/sys/fs/cgroup", "../etc", CPU) },
			"", ErrInvalid},
		{"absolute path", func() (string, error) { return CgroupFile("/sys/fs/cgroup", "/kubepods", CPU) },
			"", ErrInvalid},
		{"cgroup.pressure is no resource", func() (string, error) {
			return CgroupFile("/sys/fs/cgroup", "kubepods", "cgroup")
		}, "", ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.got()
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestCheckTriggerFile(t *testing.T) {
	t.Parallel()
	for path, ok := range map[string]bool{
		"/proc/pressure/cpu":                     true,
		"/proc/pressure/memory":                  true,
		"/host/proc/pressure/io":                 true,
		"/sys/fs/cgroup/unified/x/cpu.pressure":  true,
		"/sys/fs/cgroup/x/memory.pressure":       true,
		"irq.pressure":                           true,
		"/sys/fs/cgroup/x/cgroup.pressure":       false, // the per-group PSI switch
		"/sys/fs/cgroup/x/cgroup.procs":          false,
		"/proc/stat":                             false,
		"/proc/pressure":                         false,
		"/etc/pressure/passwd":                   false,
		"/sys/fs/cgroup/x/cpu.pressure/whatever": false,
	} {
		if err := checkTriggerFile(path); (err == nil) != ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("checkTriggerFile(%q) = %v, want ok=%v", path, err, ok)
		}
	}
}
