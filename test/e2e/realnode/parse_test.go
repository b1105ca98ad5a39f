package realnode

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
)

// errMalformed is wrapped by every parse error of this package.
var errMalformed = errors.New("malformed input")

// parseEnv parses the KEY=VALUE file up.sh writes (comments and blank lines
// skipped; values are taken verbatim, no quoting).
func parseEnv(data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("line %d %q: want KEY=VALUE: %w", n, line, errMalformed)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading env: %w", err)
	}
	return out, nil
}

// procCgroup is one process's cgroup membership from /proc/<pid>/cgroup: the path of
// each v1 controller (and named hierarchy "name=..."), and of cgroup2 under "".
type procCgroup map[string]string

// parseProcCgroup parses /proc/<pid>/cgroup ("<id>:<controllers>:<path>" lines).
func parseProcCgroup(data []byte) (procCgroup, error) {
	out := procCgroup{}
	for n, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("line %d %q: want id:controllers:path: %w", n+1, line, errMalformed)
		}
		if _, err := strconv.ParseUint(parts[0], 10, 32); err != nil {
			return nil, fmt.Errorf("line %d %q: hierarchy id: %w", n+1, line, errMalformed)
		}
		if !strings.HasPrefix(parts[2], "/") {
			return nil, fmt.Errorf("line %d %q: path is not absolute: %w", n+1, line, errMalformed)
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "" {
				return nil, fmt.Errorf("line %d %q: empty controller: %w", n+1, line, errMalformed)
			}
			out[c] = parts[2]
		}
	}
	return out, nil
}

func TestParseEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr bool
	}{
		{"up.sh output", "# comment\nKUBECONFIG=/tmp/rn/admin.kubeconfig\n\nNODE_NAME=localhost\n",
			map[string]string{"KUBECONFIG": "/tmp/rn/admin.kubeconfig", "NODE_NAME": "localhost"}, false},
		{"value with =", "A=b=c\n", map[string]string{"A": "b=c"}, false},
		{"empty value", "A=\n", map[string]string{"A": ""}, false},
		{"empty", "", map[string]string{}, false},
		{"no =", "JUNK\n", nil, true},
		{"empty key", "=v\n", nil, true},
		{"space in key", "A B=v\n", nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseEnv([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseEnv(%q) err = %v, want error %v", tc.in, err, tc.wantErr)
			}
			if err != nil {
				if !errors.Is(err, errMalformed) {
					t.Fatalf("err %v does not wrap errMalformed", err)
				}
				return
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("parseEnv(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseProcCgroup(t *testing.T) {
	t.Parallel()
	hybrid := "9:name=systemd:/\n8:pids:/kubepods/besteffort/podabc/ctr1\n4:memory:/process_api/x\n" +
		"1:cpu,cpuacct:/kubepods/understory-batch/podabc/ctr1\n0::/\n"
	tests := []struct {
		name    string
		in      string
		want    procCgroup
		wantErr bool
	}{
		{"hybrid, co-mounted cpu,cpuacct", hybrid, procCgroup{"name=systemd": "/", "pids": "/kubepods/besteffort/podabc/ctr1",
			"memory": "/process_api/x", "cpu": "/kubepods/understory-batch/podabc/ctr1",
			"cpuacct": "/kubepods/understory-batch/podabc/ctr1", "": "/"}, false},
		{"v2 only", "0::/kubepods.slice/x\n", procCgroup{"": "/kubepods.slice/x"}, false},
		{"colon in path", "1:cpu:/a:b\n", procCgroup{"cpu": "/a:b"}, false},
		{"empty", "", procCgroup{}, false},
		{"two fields", "1:cpu\n", nil, true},
		{"bad id", "x:cpu:/\n", nil, true},
		{"relative path", "1:cpu:kubepods\n", nil, true},
		{"empty controller", "1:cpu,:/\n", nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseProcCgroup([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseProcCgroup(%q) err = %v, want error %v", tc.in, err, tc.wantErr)
			}
			if err != nil {
				if !errors.Is(err, errMalformed) {
					t.Fatalf("err %v does not wrap errMalformed", err)
				}
				return
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("parseProcCgroup(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func FuzzParseEnv(f *testing.F) {
	for _, s := range []string{"A=b\n", "# c\n\nKUBECONFIG=/x\n", "=\n", "A B=c", "\x00=\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseEnv(data)
		if err != nil {
			if !errors.Is(err, errMalformed) && !strings.Contains(err.Error(), "reading env") {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		for k := range m {
			if k == "" || strings.ContainsAny(k, " \t=") {
				t.Fatalf("bad key %q accepted", k)
			}
		}
	})
}

func FuzzParseProcCgroup(f *testing.F) {
	for _, s := range []string{"1:cpu,cpuacct:/kubepods\n0::/\n", "9:name=systemd:/\n", "x::", "1:cpu:/a:b", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseProcCgroup(data)
		if err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("error %v does not wrap errMalformed", err)
			}
			return
		}
		for c, p := range m {
			if !strings.HasPrefix(p, "/") {
				t.Fatalf("controller %q: relative path %q accepted", c, p)
			}
		}
	})
}

func TestTierLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line string
		want bool
	}{
		{`I1124 manager.go:1241] failed getting container info for "/kubepods/understory-batch/pod1": unknown`, true},
		{`E1124 cgroup kubepods/understory-batch removed`, true},
		{`kubepods/understory-batch`, true},
		// Another tree on the same machine (a demo's private kubelet root).
		{`I1124 failed getting container info for "/understory-demo-25923/kubepods/understory-batch/pod3"`, false},
		{`I1124 "/x/kubepods/understory-batch"`, false},
		{`I1124 kubepods/understory-batch-other`, false},
		{`I1124 nothing here`, false},
	}
	for _, tc := range tests {
		got := len(tierLines([]string{tc.line})) == 1
		if got != tc.want {
			t.Errorf("tierLines(%q) kept %v, want %v", tc.line, got, tc.want)
		}
	}
}
