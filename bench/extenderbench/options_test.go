package extenderbench

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		set  func(*Options)
		want string // "" for valid
	}{
		{"defaults", func(*Options) {}, ""},
		{"unknown run", func(o *Options) { o.Runs["gpu"] = true }, `bad -runs entry "gpu"`},
		{"gang too big", func(o *Options) { o.GangMembers = 1 << 20 }, "need -gang-members in 1.."},
		{"no clients", func(o *Options) { o.ClientList = nil }, "pods >= clients"},
		{"bad client", func(o *Options) { o.ClientList = []int{0} }, "bad -clients entry 0"},
		{"fewer pods than clients", func(o *Options) { o.Pods = 3 }, "pods >= clients"},
		{"no duration", func(o *Options) { o.Duration = 0 }, "duration > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := DefaultOptions()
			tc.set(&o)
			err := o.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}
