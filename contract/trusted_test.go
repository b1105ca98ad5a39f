package contract

import (
	"strings"
	"testing"
)

// TestTrustedKeysWellFormed checks the list itself: each key once, a known kind and
// fence, writers (service accounts) exactly where the fence names them, a policy, a
// rule and a reader. TestTrustedKeysFencedByPolicy (test/e2e) holds it to the policies.
func TestTrustedKeysWellFormed(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, k := range TrustedKeys() {
		id := string(k.Kind) + " " + k.Key
		if seen[id] {
			t.Errorf("%s listed twice", id)
		}
		seen[id] = true
		switch k.Kind {
		case KindPodAnnotation, KindNodeAnnotation, KindWorkloadLabel:
		default:
			t.Errorf("%s: unknown kind", id)
		}
		switch k.Fence {
		case FenceWriters, FenceRBAC:
			if len(k.Writers) == 0 {
				t.Errorf("%s: fence %s without writers", id, k.Fence)
			}
		case FenceImmutable:
			if len(k.Writers) != 0 {
				t.Errorf("%s: immutable, yet writers %v", id, k.Writers)
			}
		default:
			t.Errorf("%s: unknown fence %q", id, k.Fence)
		}
		for _, w := range k.Writers {
			if parts := strings.Split(w, ":"); len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" {
				t.Errorf("%s: writer %q is not a service account's user name", id, w)
			}
		}
		if !strings.HasPrefix(k.Key, "understory.io/") || k.Policy == "" || k.Rule == "" || k.Reader == "" ||
			k.WrittenBy == "" {
			t.Errorf("%s: incomplete entry %+v", id, k)
		}
	}
	for _, want := range []string{AnnotationGPUDevices, AnnotationGangState, AnnotationExtenderCatchUp,
		AnnotationOriginalResources, AnnotationNodeMetrics, AnnotationNodeMetricsV2, LabelQuotaEvicted} {
		found := false
		for _, k := range TrustedKeys() {
			found = found || k.Key == want
		}
		if !found {
			t.Errorf("%s is not listed", want)
		}
	}
}
