package contract

import "testing"

func TestBatchResourceName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
		ok       bool
		alias    string
	}{
		{ResourceBatchCPU, ResourceBatchCPU, true, ResourceKoordinatorBatchCPU},
		{ResourceBatchMemory, ResourceBatchMemory, true, ResourceKoordinatorBatchMemory},
		{ResourceKoordinatorBatchCPU, ResourceBatchCPU, true, ""},
		{ResourceKoordinatorBatchMemory, ResourceBatchMemory, true, ""},
		{"cpu", "", false, ""},
		{"kubernetes.io/mid-cpu", "", false, ""},
		{ResourceGPUMilli, "", false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, ok := BatchResourceName(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("BatchResourceName(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			}
			if a := KoordinatorAlias(tc.in); a != tc.alias {
				t.Fatalf("KoordinatorAlias(%q) = %q; want %q", tc.in, a, tc.alias)
			}
		})
	}
}
