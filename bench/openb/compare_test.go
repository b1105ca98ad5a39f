package openb

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func cell(seeds ...Result) *Cell { return &Cell{Seeds: seeds} }

func TestCompareMarkdown(t *testing.T) {
	t.Parallel()
	base := &Table{Seeds: []int64{42, 43}, Policies: []string{"fgd", "understory"}, Rows: []Row{
		{Workload: "openb_pod_list_a", Policies: map[string]*Cell{
			"fgd":        cell(Result{Seed: 42, AllocAt100: 90, AllocAt130: 91}, Result{Seed: 43, AllocAt100: 80, AllocAt130: 81}),
			"understory": cell(Result{Seed: 42, AllocAt100: 90.5, AllocAt130: 91.25}, Result{Seed: 43, AllocAt100: 1, AllocAt130: 1}),
		}},
		{Workload: "openb_pod_list_b", Policies: map[string]*Cell{
			"understory": cell(Result{Seed: 43, AllocAt100: 50, AllocAt130: 50}), // no seed 42: left out
		}},
		{Workload: "openb_pod_list_c", Policies: map[string]*Cell{
			"understory": cell(Result{Seed: 42, AllocAt100: 80, AllocAt130: 81}),
		}},
	}}
	look := &LookaheadResult{Lookahead: Lookahead{Candidates: 4, Horizon: 500, From: 0.8}, Decisions: 7, Changed: 2}
	search := &SearchResult{Search: Search{Tries: 10, Candidates: 4, Changes: 2, To: 1.3}, Window: 900, Deviations: 12}
	probe := &Table{Seeds: []int64{42}, Policies: []string{"understory"}, Rows: []Row{
		{Workload: "openb_pod_list_a", Policies: map[string]*Cell{
			"understory": cell(Result{Seed: 42, AllocAt100: 91, AllocAt130: 91.5, Lookahead: look}),
		}},
		{Workload: "openb_pod_list_b", Policies: map[string]*Cell{
			"understory": cell(Result{Seed: 42, AllocAt100: 60, AllocAt130: 60}),
		}},
		{Workload: "openb_pod_list_c", Policies: map[string]*Cell{
			"understory": cell(Result{Seed: 42, AllocAt100: 81, AllocAt130: 81.5, Search: search}),
		}},
	}}
	// Through JSON and back, as the CLI reads it.
	path := filepath.Join(t.TempDir(), "base.json")
	b, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	read, err := ReadTable(path)
	if err != nil {
		t.Fatal(err)
	}
	md := probe.CompareMarkdown(read)
	for _, want := range []string{
		"| a | understory | 90.50 / 91.25 | 91.00 / 91.50 | +0.50 / +0.25 | +1.00 / +0.50 | 7 / 2 |",
		"| c | understory | 80.00 / 81.00 | 81.00 / 81.50 | +1.00 / +0.50 | - | 900 / 12 |",
		"| **mean** | understory | | | +0.75 / +0.38 | +1.00 / +0.50 | |",
	} {
		if !strings.Contains(md, want) {
			t.Fatalf("missing %q in:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| b |") {
		t.Fatalf("workload without the seed compared:\n%s", md)
	}
}

func TestReadTableErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTable(bad); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("bad json: %v", err)
	}
	if _, err := ReadTable(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}
