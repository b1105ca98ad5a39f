package gang

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

func TestPodGangDialects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		pod         *corev1.Pod
		ok          bool
		key, dia    string
		min         int
		wantErrPart string
	}{
		{"none", podtest.Pod("ns", "p"), false, "", "", 0, ""},
		{"podgroup label", podtest.Pod("ns", "p", podtest.Label(contract.LabelPodGroup, "pg")), true, "ns/pg", DialectPodGroup, 0, ""},
		{"volcano", podtest.Pod("ns", "p", podtest.Volcano("vg", 3)...), true, "ns/vg", DialectVolcano, 3, ""},
		{"volcano alt name", podtest.Pod("ns", "p", podtest.Annotate(contract.AnnotationVolcanoGroupNameAlt, "vg"),
			podtest.Annotate(contract.AnnotationVolcanoMinMember, "2")), true, "ns/vg", DialectVolcano, 2, ""},
		// Volcano's minMember is its PodGroup's: no annotation is no error (gangBook.minMember waits for the PodGroup).
		{"volcano missing min", podtest.Pod("ns", "p", podtest.Annotate(contract.AnnotationVolcanoGroupName, "vg")), true, "ns/vg", DialectVolcano, 0, ""},
		{"volcano bad min", podtest.Pod("ns", "p", podtest.Annotate(contract.AnnotationVolcanoGroupName, "vg"),
			podtest.Annotate(contract.AnnotationVolcanoMinMember, "x")), true, "ns/vg", DialectVolcano, 0, "1..10000"},
		{"koordinator", podtest.Pod("ns", "p", podtest.Annotate(contract.AnnotationKoordinatorName, "kg"),
			podtest.Annotate(contract.AnnotationKoordinatorMinAvailable, "5")), true, "ns/kg", DialectKoordinator, 5, ""},
		{"koordinator bad min", podtest.Pod("ns", "p", podtest.Annotate(contract.AnnotationKoordinatorName, "kg"),
			podtest.Annotate(contract.AnnotationKoordinatorMinAvailable, "-1")), true, "ns/kg", DialectKoordinator, 0, "1..10000"},
		{"label wins over annotations", podtest.Pod("ns", "p", podtest.Label(contract.LabelPodGroup, "pg"),
			podtest.Annotate(contract.AnnotationKoordinatorName, "kg")), true, "ns/pg", DialectPodGroup, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ref, ok := podGang(tc.pod)
			if ok != tc.ok || ref.key != tc.key || ref.dialect != tc.dia || ref.min != tc.min {
				t.Fatalf("got %+v %v", ref, ok)
			}
			if tc.wantErrPart == "" && ref.err != nil || tc.wantErrPart != "" && (ref.err == nil ||
				!strings.Contains(ref.err.Error(), tc.wantErrPart) || !errors.Is(ref.err, ErrInvalidGang)) {
				t.Fatalf("err %v, want %q", ref.err, tc.wantErrPart)
			}
		})
	}
}
