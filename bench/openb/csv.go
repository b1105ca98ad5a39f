package openb

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/understory/understory/contract"

	"github.com/understory/understory/scheduler-extender/placement"
)

// ErrBadCSV means a trace file is not what the openb format says; the error names
// file:line and the column.
var ErrBadCSV = errors.New("bad openb csv")

// DefaultMaxPods is the pod capacity the FGD artifact gives every openb node.
const DefaultMaxPods = 1001

// maxNodeGPUs bounds the GPUs of one node in a trace.
const maxNodeGPUs = contract.MaxGPUsPerNode

// Pod is one task of a trace.
type Pod struct {
	Name    string
	Request placement.Request
}

// Columns each file must have (others are ignored).
var (
	nodeColumns = []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}
	podColumns  = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}
	// optionalColumns may be missing (the multigpu lists have no gpu_spec); they read as "".
	optionalColumns = []string{"gpu_spec"}
)

// ReadNodes reads an openb node list. maxPods <= 0 means DefaultMaxPods.
func ReadNodes(path string, maxPods int) ([]*placement.Node, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading nodes: %w", err)
	}
	defer f.Close()
	return ParseNodes(f, path, maxPods)
}

// ReadPods reads an openb pod list.
func ReadPods(path string) ([]Pod, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading pods: %w", err)
	}
	defer f.Close()
	return ParsePods(f, path)
}

// ParseNodes parses a node list; name is used in errors.
func ParseNodes(r io.Reader, name string, maxPods int) ([]*placement.Node, error) {
	if maxPods <= 0 {
		maxPods = DefaultMaxPods
	}
	var nodes []*placement.Node
	seen := map[string]int{}
	err := eachRow(r, name, nodeColumns, func(line int, row map[string]string) error {
		n, err := ParseNodeRow(row)
		if err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if prev, ok := seen[n.Name]; ok {
			return fmt.Errorf("%s:%d: column sn: node %q already on line %d: %w", name, line, n.Name, prev, ErrBadCSV)
		}
		seen[n.Name] = line
		n.MaxPods = maxPods
		nodes = append(nodes, n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%s: no nodes: %w", name, ErrBadCSV)
	}
	return nodes, nil
}

// ParsePods parses a pod list; name is used in errors.
func ParsePods(r io.Reader, name string) ([]Pod, error) {
	var pods []Pod
	seen := map[string]int{}
	err := eachRow(r, name, podColumns, func(line int, row map[string]string) error {
		p, err := ParsePodRow(row)
		if err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if prev, ok := seen[p.Name]; ok {
			return fmt.Errorf("%s:%d: column name: pod %q already on line %d: %w", name, line, p.Name, prev, ErrBadCSV)
		}
		seen[p.Name] = line
		pods = append(pods, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("%s: no pods: %w", name, ErrBadCSV)
	}
	return pods, nil
}

// eachRow reads a headed CSV and hands each data row, keyed by column, to fn.
func eachRow(r io.Reader, name string, want []string, fn func(line int, row map[string]string) error) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return fmt.Errorf("%s:1: header: %v: %w", name, err, ErrBadCSV)
	}
	idx := map[string]int{}
	for i, h := range header {
		idx[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, c := range want {
		if _, ok := idx[c]; !ok {
			return fmt.Errorf("%s:1: column %s missing from header: %w", name, c, ErrBadCSV)
		}
	}
	row := make(map[string]string, len(want)+len(optionalColumns))
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			line := 0
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				line = pe.Line
			}
			return fmt.Errorf("%s:%d: %v: %w", name, line, err, ErrBadCSV)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(header) {
			return fmt.Errorf("%s:%d: %d fields, header has %d: %w", name, line, len(rec), len(header), ErrBadCSV)
		}
		for _, c := range want {
			row[c] = strings.TrimSpace(rec[idx[c]])
		}
		for _, c := range optionalColumns {
			if i, ok := idx[c]; ok {
				row[c] = strings.TrimSpace(rec[i])
			}
		}
		if err := fn(line, row); err != nil {
			return err
		}
	}
}

// ParseNodeRow parses one node row keyed by column (sn, cpu_milli, memory_mib, gpu, model).
func ParseNodeRow(row map[string]string) (*placement.Node, error) {
	name := row["sn"]
	if name == "" {
		return nil, fmt.Errorf("column sn: empty: %w", ErrBadCSV)
	}
	cpu, err := intColumn(row, "cpu_milli", 1, 1<<40)
	if err != nil {
		return nil, err
	}
	mem, err := intColumn(row, "memory_mib", 0, 1<<40)
	if err != nil {
		return nil, err
	}
	gpus, err := intColumn(row, "gpu", 0, maxNodeGPUs)
	if err != nil {
		return nil, err
	}
	model := row["model"]
	if gpus > 0 && model == "" {
		return nil, fmt.Errorf("column model: empty for a node with %d gpus: %w", gpus, ErrBadCSV)
	}
	if gpus == 0 {
		model = ""
	}
	n := &placement.Node{Name: name, Model: model, CPUMilli: cpu, MemoryMiB: mem, GPUFree: make([]int, gpus)}
	for i := range n.GPUFree {
		n.GPUFree[i] = contract.MilliPerGPU
	}
	return n, nil
}

// ParsePodRow parses one pod row keyed by column (name, cpu_milli, memory_mib,
// num_gpu, gpu_milli and, optionally, gpu_spec: allowed models separated by "|").
func ParsePodRow(row map[string]string) (Pod, error) {
	name := row["name"]
	if name == "" {
		return Pod{}, fmt.Errorf("column name: empty: %w", ErrBadCSV)
	}
	cpu, err := intColumn(row, "cpu_milli", 0, 1<<40)
	if err != nil {
		return Pod{}, err
	}
	mem, err := intColumn(row, "memory_mib", 0, 1<<40)
	if err != nil {
		return Pod{}, err
	}
	num, err := intColumn(row, "num_gpu", 0, maxNodeGPUs)
	if err != nil {
		return Pod{}, err
	}
	milli, err := intColumn(row, "gpu_milli", 0, contract.MilliPerGPU)
	if err != nil {
		return Pod{}, err
	}
	r := placement.Request{CPUMilli: cpu, MemoryMiB: mem, NumGPU: int(num), GPUMilli: int(milli)}
	if spec := row["gpu_spec"]; spec != "" {
		for _, m := range strings.Split(spec, "|") {
			if m = strings.TrimSpace(m); m != "" {
				r.Models = append(r.Models, m)
			}
		}
	}
	if err := r.Validate(); err != nil {
		return Pod{}, fmt.Errorf("columns num_gpu, gpu_milli: %w: %w", err, ErrBadCSV)
	}
	return Pod{Name: name, Request: r}, nil
}

func intColumn(row map[string]string, col string, lo, hi int64) (int64, error) {
	s := row[col]
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Some exports write integral values as floats ("1000.0").
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.Abs(f) > 1<<53 || f != math.Trunc(f) {
			return 0, fmt.Errorf("column %s: %q is not an integer: %w", col, s, ErrBadCSV)
		}
		v = int64(f)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("column %s: %d not in %d..%d: %w", col, v, lo, hi, ErrBadCSV)
	}
	return v, nil
}
