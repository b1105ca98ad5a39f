package openb

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParsePods(t *testing.T) {
	t.Parallel()
	const head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
	tests := []struct {
		name    string
		in      string
		wantErr string // substring; "" means no error
		check   func(t *testing.T, pods []Pod)
	}{
		{"ok", head + "p1,1000,2048,1,500,,LS\np2,0,0,0,0,,BE\np3,4000,1,2,1000,T4|V100,LS\n", "", func(t *testing.T, pods []Pod) {
			if len(pods) != 3 || pods[0].Request.GPUMilli != 500 || pods[1].Request.CPUMilli != 0 ||
				len(pods[2].Request.Models) != 2 || pods[2].Request.Models[1] != "V100" {
				t.Fatalf("pods %+v", pods)
			}
		}},
		{"no gpu_spec column", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1,8,1000\n", "", func(t *testing.T, pods []Pod) {
			if pods[0].Request.NumGPU != 8 || pods[0].Request.Models != nil {
				t.Fatalf("pods %+v", pods)
			}
		}},
		{"float integers", head + "p1,1000.0,1,1,500.0,,LS\n", "", nil},
		{"missing column", "name,cpu_milli,memory_mib,num_gpu\np1,1,1,1\n", "pods.csv:1: column gpu_milli missing", nil},
		{"bad cpu", head + "p1,1000,1,1,500,,LS\np2,lots,1,1,500,,LS\n", `pods.csv:3: column cpu_milli: "lots" is not an integer`, nil},
		{"negative memory", head + "p1,1,-1,0,0,,LS\n", "pods.csv:2: column memory_mib: -1 not in", nil},
		{"milli above a gpu", head + "p1,1,1,1,1500,,LS\n", "pods.csv:2: column gpu_milli: 1500 not in", nil},
		{"share on two gpus", head + "p1,1,1,2,500,,LS\n", "pods.csv:2: columns num_gpu, gpu_milli", nil},
		{"empty name", head + ",1,1,0,0,,LS\n", "pods.csv:2: column name: empty", nil},
		{"duplicate", head + "p1,1,1,0,0,,LS\np1,1,1,0,0,,LS\n", `pods.csv:3: column name: pod "p1" already on line 2`, nil},
		{"short row", head + "p1,1,1\n", "pods.csv:2: 3 fields, header has 7", nil},
		{"no rows", head, "pods.csv: no pods", nil},
		{"empty file", "", "pods.csv:1: header", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pods, err := ParsePods(strings.NewReader(tc.in), "pods.csv")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.check != nil {
					tc.check(t, pods)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrBadCSV) {
				t.Fatalf("err = %v, want %q wrapping ErrBadCSV", err, tc.wantErr)
			}
		})
	}
}

func TestParseNodes(t *testing.T) {
	t.Parallel()
	const head = "sn,cpu_milli,memory_mib,gpu,model\n"
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{"ok", head + "n1,96000,393216,8,G2\nn2,32000,1,0,\n", ""},
		{"gpu node without model", head + "n1,96000,1,8,\n", "nodes.csv:2: column model: empty"},
		{"zero cpu", head + "n1,0,1,8,G2\n", "nodes.csv:2: column cpu_milli: 0 not in"},
		{"too many gpus", head + "n1,1,1,65,G2\n", "nodes.csv:2: column gpu: 65 not in"},
		{"duplicate", head + "n1,1,1,1,G2\nn1,1,1,1,G2\n", `nodes.csv:3: column sn: node "n1" already on line 2`},
		{"bad quote", head + "n1,\"1,1,1,G2\n", "nodes.csv:2:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nodes, err := ParseNodes(strings.NewReader(tc.in), "nodes.csv", 0)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(nodes) != 2 || len(nodes[0].GPUFree) != 8 || nodes[0].GPUFree[7] != 1000 || nodes[0].MaxPods != DefaultMaxPods || nodes[1].Model != "" {
					t.Fatalf("nodes %+v", nodes)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrBadCSV) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestReadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "nodes.csv")
	if err := os.WriteFile(p, []byte("sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1,2,T4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes, err := ReadNodes(p, 7)
	if err != nil || len(nodes) != 1 || nodes[0].MaxPods != 7 {
		t.Fatalf("ReadNodes = %+v, %v", nodes, err)
	}
	if _, err := ReadPods(filepath.Join(dir, "missing.csv")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadPods(missing) = %v", err)
	}
}

func FuzzParsePodRow(f *testing.F) {
	for _, s := range []string{"p,1000,1,1,500,T4|V100", "p,0,0,0,0,", "p,1e3,1,8,1000,", ",,,,,", "p,-1,1,1,1,|"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		fields := strings.Split(line, ",")
		row := map[string]string{}
		for i, c := range []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"} {
			if i < len(fields) {
				row[c] = fields[i]
			}
		}
		p, err := ParsePodRow(row)
		if err != nil {
			if !errors.Is(err, ErrBadCSV) {
				t.Fatalf("error %v does not wrap ErrBadCSV", err)
			}
			return
		}
		if p.Name == "" || p.Request.Validate() != nil || p.Request.CPUMilli < 0 {
			t.Fatalf("accepted a bad row: %+v", p)
		}
	})
}

func FuzzParseNodes(f *testing.F) {
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn1,96000,393216,8,G2\n")
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn1,\"9\n")
	f.Fuzz(func(t *testing.T, in string) {
		nodes, err := ParseNodes(strings.NewReader(in), "fuzz.csv", 0)
		if err != nil {
			if !errors.Is(err, ErrBadCSV) {
				t.Fatalf("error %v does not wrap ErrBadCSV", err)
			}
			return
		}
		for _, n := range nodes {
			if n.Name == "" || n.CPUMilli <= 0 || len(n.GPUFree) > maxNodeGPUs {
				t.Fatalf("accepted a bad node: %+v", n)
			}
		}
	})
}
