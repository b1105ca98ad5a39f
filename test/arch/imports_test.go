package arch

import (
	"slices"
	"testing"
)

// TestImportRules loads the module's import graph and fails on every import that
// breaks one of Rules, and on every exception that no import needs any more.
func TestImportRules(t *testing.T) {
	t.Parallel()
	g, err := LoadGraph(moduleRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ToolMains {
		if _, ok := g.Imports[m]; !ok {
			t.Errorf("ToolMains names %s, which is no package of the module", m)
		}
	}
	broken, stale := Check(g, Rules(), nil) // no import is excepted from any rule
	for _, v := range broken {
		t.Errorf("%s", v)
	}
	for _, e := range stale {
		t.Errorf("exception %s -> %s of rule %q is not needed any more: remove it", e.From, e.To, e.Rule)
	}
	t.Logf("%d packages, %d rules, no exceptions", len(g.Imports), len(Rules()))
}

// TestRulesFire feeds each rule a made-up graph with one import that breaks it and
// one that does not, and checks that the rule reports exactly the first.
func TestRulesFire(t *testing.T) {
	t.Parallel()
	tests := []struct {
		rule  string
		graph Graph
		want  []Violation
	}{{
		rule: "production imports neither bench nor test",
		graph: Graph{Imports: map[string][]string{
			"koordlet":                  {"bench/internal/proc"},
			"cmd/koordlet":              {"koordlet", "test/e2e/controlplane"},
			"cmd/colo":                  {"bench/colo"}, // a tool's main
			"bench/colo":                {"koordlet"},
			"bench/internal/proc":       nil,
			"test/e2e/controlplane":     nil,
			"scheduler-extender/wire":   nil,
			"scheduler-extender/gang":   {"scheduler-extender/wire"},
			"scheduler-extender/placer": nil,
		}, TestImports: map[string][]string{"scheduler-extender/gang": {"test/e2e/controlplane"}}},
		want: []Violation{
			{Rule: "production imports neither bench nor test", From: "cmd/koordlet", To: "test/e2e/controlplane"},
			{Rule: "production imports neither bench nor test", From: "koordlet", To: "bench/internal/proc"},
		},
	}, {
		rule: "koordlet imports nothing of the scheduler extender",
		graph: Graph{Imports: map[string][]string{
			"koordlet/gpu":       {"contract", "scheduler-extender/placement"},
			"koordlet":           {"koordlet/gpu", "qos"},
			"contract":           nil,
			"qos":                nil,
			"scheduler-extender": {"koordlet"}, // the other rule's
		}},
		want: []Violation{{Rule: "koordlet imports nothing of the scheduler extender", From: "koordlet/gpu",
			To: "scheduler-extender/placement"}},
	}, {
		rule: "the scheduler extender imports nothing of koordlet",
		graph: Graph{Imports: map[string][]string{
			"scheduler-extender":      {"scheduler-extender/wire", "koordlet/podsource"},
			"scheduler-extender/wire": {"contract"},
			"koordlet/podsource":      nil,
			"contract":                nil,
		}},
		want: []Violation{{Rule: "the scheduler extender imports nothing of koordlet", From: "scheduler-extender",
			To: "koordlet/podsource"}},
	}, {
		rule: "admission imports neither koordlet nor the scheduler extender",
		graph: Graph{Imports: map[string][]string{
			"admission":          {"contract", "qos", "koordlet", "scheduler-extender"},
			"koordlet":           nil,
			"scheduler-extender": nil,
		}},
		want: []Violation{
			{Rule: "admission imports neither koordlet nor the scheduler extender", From: "admission", To: "koordlet"},
			{Rule: "admission imports neither koordlet nor the scheduler extender", From: "admission",
				To: "scheduler-extender"},
		},
	}, {
		rule: "qos imports neither cgroups nor metrics",
		graph: Graph{Imports: map[string][]string{
			"qos":                 {"contract", "cgroups/cgroupstest", "metrics"},
			"cgroups/cgroupstest": nil,
			"metrics":             nil,
		}},
		want: []Violation{
			{Rule: "qos imports neither cgroups nor metrics", From: "qos", To: "cgroups/cgroupstest"},
			{Rule: "qos imports neither cgroups nor metrics", From: "qos", To: "metrics"},
		},
	}, {
		rule: "contract imports nothing of the module",
		graph: Graph{Imports: map[string][]string{
			"contract": {"internal/testenv"},
			"qos":      {"contract"},
		}},
		want: []Violation{{Rule: "contract imports nothing of the module", From: "contract", To: "internal/testenv"}},
	}, {
		rule: "internal holds only leaves",
		graph: Graph{Imports: map[string][]string{
			"internal/election":   {"contract", "internal/certreload"}, // leaves
			"internal/certreload": nil,
			"internal/plugin":     {"qos", "internal/election"}, // qos is outside internal/
			"internal/wrapper":    {"internal/plugin"},          // internal/plugin is no leaf
			"qos":                 {"contract"},
			"contract":            nil,
		}},
		want: []Violation{
			{Rule: "internal holds only leaves", From: "internal/plugin", To: "qos"},
			{Rule: "internal holds only leaves", From: "internal/wrapper", To: "internal/plugin"},
		},
	}, {
		rule: "production imports no test harness",
		graph: Graph{Imports: map[string][]string{
			"koordlet":              {"internal/testenv"},
			"bench/clusterbench":    {"internal/controlplane", "internal/kueueharness"}, // benchmarks may
			"internal/kueueharness": {"internal/controlplane"},                          // harnesses share
			"internal/controlplane": {"internal/testenv"},
			"internal/testenv":      nil,
			"cgroups/cgroupstest":   {"internal/testenv"}, // test support may
		}},
		want: []Violation{{Rule: "production imports no test harness", From: "koordlet", To: "internal/testenv"}},
	}, {
		rule: "nothing outside test imports test",
		graph: Graph{Imports: map[string][]string{
			"bench/clusterbench":    {"test/e2e/controlplane"},
			"bench/colo":            nil,
			"test/e2e":              {"test/e2e/controlplane"},
			"test/e2e/controlplane": nil,
		}, TestImports: map[string][]string{"bench/colo": {"test/e2e/kueueharness"}}},
		want: []Violation{
			{Rule: "nothing outside test imports test", From: "bench/clusterbench", To: "test/e2e/controlplane"},
			{Rule: "nothing outside test imports test", From: "bench/colo", To: "test/e2e/kueueharness", Test: true},
		},
	}}
	rules := Rules()
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			t.Parallel()
			i := slices.IndexFunc(rules, func(r Rule) bool { return r.Name == tt.rule })
			if i < 0 {
				t.Fatalf("no rule %q", tt.rule)
			}
			got, stale := Check(&tt.graph, rules[i:i+1], nil)
			if !slices.Equal(got, tt.want) {
				t.Errorf("violations:\n got %v\nwant %v", got, tt.want)
			}
			if len(stale) != 0 {
				t.Errorf("stale exceptions without exceptions: %v", stale)
			}
			// The same import named as an exception passes, and an exception for an
			// import that breaks nothing is reported stale.
			var ex []Exception
			for _, v := range tt.want {
				ex = append(ex, Exception{Rule: v.Rule, From: v.From, To: v.To})
			}
			unused := Exception{Rule: tt.rule, From: "nowhere", To: "contract"}
			got, stale = Check(&tt.graph, rules[i:i+1], append(ex, unused))
			if len(got) != 0 {
				t.Errorf("violations despite exceptions: %v", got)
			}
			if !slices.Equal(stale, []Exception{unused}) {
				t.Errorf("stale exceptions: got %v, want only %v", stale, unused)
			}
		})
	}
}

// TestIsLeaf pins the definition of a leaf on a made-up graph.
func TestIsLeaf(t *testing.T) {
	t.Parallel()
	g := &Graph{Imports: map[string][]string{
		"contract":          nil,
		"internal/a":        nil,
		"internal/b":        {"internal/a", "contract"},
		"internal/c":        {"qos"},
		"internal/d":        {"internal/c"},
		"qos":               {"contract"},
		"koordlet":          {"qos"},
		"cmd/kubectl-x/cli": {"internal/b"},
	}}
	tests := []struct {
		pkg  string
		leaf bool
	}{
		{"contract", true},
		{"internal/a", true},
		{"internal/b", true},
		{"internal/c", false},
		{"internal/d", false},
		{"qos", true},
		{"koordlet", false},
		{"cmd/kubectl-x/cli", true},
	}
	for _, tt := range tests {
		if got := IsLeaf(g, tt.pkg); got != tt.leaf {
			t.Errorf("IsLeaf(%s) = %v, want %v", tt.pkg, got, tt.leaf)
		}
	}
}
