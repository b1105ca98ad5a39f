package gang

import (
	"slices"
	"testing"
	"time"
)

func TestParsePlanState(t *testing.T) {
	t.Parallel()
	exp := time.Unix(1700000000, 0)
	tests := []struct {
		in   string
		want *persistedPlan
	}{
		{"planned:7:n1:0,3:1700000000", &persistedPlan{id: 7, node: "n1", devices: []int{0, 3}, expires: exp}},
		{"planned:7:n1::1700000000", &persistedPlan{id: 7, node: "n1", expires: exp}},
		{"planned:7:n1", nil}, // an older release's record: not resumable
		{"planned:x:n1:0:1700000000", nil},
		{"planned:7::0:1700000000", nil},
		{"planned:7:n1:0,0:1700000000", nil},
		{"planned:7:n1:0:soon", nil},
		{"bound:7:n1:0:1700000000", nil},
		{"", nil},
	}
	for _, tc := range tests {
		got, ok := parsePlanState(tc.in)
		if ok != (tc.want != nil) {
			t.Fatalf("parsePlanState(%q) ok = %v", tc.in, ok)
		}
		if ok && (got.id != tc.want.id || got.node != tc.want.node || !slices.Equal(got.devices, tc.want.devices) ||
			!got.expires.Equal(tc.want.expires)) {
			t.Fatalf("parsePlanState(%q) = %+v, want %+v", tc.in, got, *tc.want)
		}
	}
	sl := planSlot{node: "n2", devs: []int{1, 2}}
	if got, ok := parsePlanState(formatPlanState(9, sl, exp)); !ok || got.id != 9 || got.node != "n2" ||
		!slices.Equal(got.devices, sl.devs) || !got.expires.Equal(exp) {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
}

// FuzzParsePlanState: the gang-state annotation is outside input (anyone may
// write it): parsing never panics, and what parses formats back to a value
// that parses the same.
func FuzzParsePlanState(f *testing.F) {
	for _, s := range []string{"planned:7:n1:0,3:1700000000", "planned:7:n1::0", "planned:1:a:63:-5",
		"planned:7:n1", "planned::::", "planned:18446744073709551615:n:0:9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pp, ok := parsePlanState(s)
		if !ok {
			return
		}
		again, ok := parsePlanState(formatPlanState(pp.id, planSlot{node: pp.node, devs: pp.devices}, pp.expires))
		if !ok || again.id != pp.id || again.node != pp.node || !slices.Equal(again.devices, pp.devices) ||
			!again.expires.Equal(pp.expires) {
			t.Fatalf("%q parsed as %+v, formats back as %+v (%v)", s, pp, again, ok)
		}
	})
}
