package gang

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

// checkGroupSpec checks what a PodGroup decoder may return: a minMember in
// 1..MaxGangSize and a timeout in 0..maxScheduleTimeout, or an error wrapping
// ErrInvalidGang and nothing else.
func checkGroupSpec(t *testing.T, what string, spec podGroupSpec) {
	t.Helper()
	if spec.err != nil {
		if !errors.Is(spec.err, ErrInvalidGang) {
			t.Fatalf("%s: error %v does not wrap ErrInvalidGang", what, spec.err)
		}
		return
	}
	if spec.minMember < 1 || spec.minMember > contract.MaxGangSize {
		t.Fatalf("%s: minMember %d accepted", what, spec.minMember)
	}
	if spec.timeout < 0 || spec.timeout > maxScheduleTimeout || spec.timeout%time.Second != 0 {
		t.Fatalf("%s: timeout %v accepted", what, spec.timeout)
	}
}

// FuzzPodGroupDecoders feeds PodGroup documents, decoded as the dynamic
// informer decodes them (unstructured JSON: integral numbers become int64,
// others float64), to the decoders of the scheduler-plugins and Volcano
// PodGroups and to the gangs. A PodGroup is outside input: anyone allowed to
// create one can write any spec.
func FuzzPodGroupDecoders(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"scheduling.x-k8s.io/v1alpha1","kind":"PodGroup","metadata":{"name":"g","namespace":"ns"},"spec":{"minMember":3}}`,
		`{"apiVersion":"scheduling.x-k8s.io/v1alpha1","kind":"PodGroup","metadata":{"name":"g","namespace":"ns"},"spec":{"minMember":3,"scheduleTimeoutSeconds":30}}`,
		`{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"PodGroup","metadata":{"name":"g","namespace":"ns"},"spec":{"minMember":2,"queue":"default"}}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":{"minMember":2.5}}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":{"minMember":"3"}}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":{"minMember":1e300,"scheduleTimeoutSeconds":-1}}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":{"minMember":10001}}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":{"minMember":9223372036854775807,"scheduleTimeoutSeconds":86401}}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":null}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":[1,2]}`,
		`{"apiVersion":"v1","kind":"PodGroup","spec":{"minMember":null,"scheduleTimeoutSeconds":null}}`,
	} {
		f.Add([]byte(s))
	}
	st := newFakeIndex(Config{MaxMembers: 1000, PlanTTL: time.Minute, BindTimeout: 20 * time.Second}, time.Now).gs
	f.Fuzz(func(t *testing.T, doc []byte) {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(doc); err != nil {
			return // the informer's decoder refuses it: never reaches the extender
		}
		checkGroupSpec(t, "scheduler-plugins", parsePodGroup(u))
		spec := parseVolcanoPodGroup(u)
		checkGroupSpec(t, "volcano", spec)
		if spec.timeout != 0 {
			t.Fatalf("volcano: timeout %v from a Volcano PodGroup (it has none)", spec.timeout)
		}
		st.UpsertPodGroup(u)
		st.UpsertVolcanoPodGroup(u)
		st.DeletePodGroup(u.GetNamespace(), u.GetName())
		st.DeleteVolcanoPodGroup(u.GetNamespace(), u.GetName())
	})
}

// FuzzPodGangAnnotations feeds the gang labels and annotations of the three
// dialects (the scheduler-plugins label, Volcano's group name and min-member
// annotations, Koordinator's name and min-available annotations; Koordinator
// has no PodGroup: its annotations are its whole protocol) to podGang.
func FuzzPodGangAnnotations(f *testing.F) {
	f.Add("", "", "", "k", "3")
	f.Add("pg", "", "", "", "")
	f.Add("", "vg", "2", "", "")
	f.Add("", "vg", "", "", "")
	f.Add("", "", "", "k", "0")
	f.Add("", "", "", "k", " 10000 ")
	f.Add("", "vg", "1e3", "k", "-1")
	f.Add("", "", "", "k", "99999999999999999999")
	f.Fuzz(func(t *testing.T, pgLabel, vName, vMin, kName, kMin string) {
		opts := []podtest.Opt{}
		set := func(k, v string, anno bool) {
			if v == "" {
				return
			}
			if anno {
				opts = append(opts, podtest.Annotate(k, v))
			} else {
				opts = append(opts, podtest.Label(k, v))
			}
		}
		set(contract.LabelPodGroup, pgLabel, false)
		set(contract.AnnotationVolcanoGroupName, vName, true)
		set(contract.AnnotationVolcanoMinMember, vMin, true)
		set(contract.AnnotationKoordinatorName, kName, true)
		set(contract.AnnotationKoordinatorMinAvailable, kMin, true)
		ref, ok := podGang(podtest.Pod("ns", "p", opts...))
		if ok != (pgLabel != "" || vName != "" || kName != "") {
			t.Fatalf("gang %v for label %q, volcano %q, koordinator %q", ok, pgLabel, vName, kName)
		}
		if !ok {
			return
		}
		want := map[bool]string{true: DialectPodGroup}[pgLabel != ""]
		if want == "" && vName != "" {
			want = DialectVolcano
		} else if want == "" {
			want = DialectKoordinator
		}
		if ref.dialect != want || ref.key != "ns/"+ref.name || ref.name == "" {
			t.Fatalf("ref %+v, want dialect %s", ref, want)
		}
		switch {
		case ref.err != nil:
			if !errors.Is(ref.err, ErrInvalidGang) {
				t.Fatalf("error %v does not wrap ErrInvalidGang", ref.err)
			}
			if ref.dialect == DialectPodGroup {
				t.Fatalf("a PodGroup member's minMember is its PodGroup's: error %v", ref.err)
			}
		case ref.dialect == DialectKoordinator && (ref.min < 1 || ref.min > contract.MaxGangSize):
			t.Fatalf("koordinator min-available %q accepted as %d", kMin, ref.min)
		case ref.min < 0 || ref.min > contract.MaxGangSize:
			t.Fatalf("minMember %d accepted", ref.min)
		}
	})
}

func TestParsePodGroup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		spec    map[string]any
		min     int
		timeout time.Duration
		bad     bool
	}{
		{"min only", map[string]any{"minMember": int64(3)}, 3, 0, false},
		{"float from json", map[string]any{"minMember": float64(4), "scheduleTimeoutSeconds": float64(30)}, 4, 30 * time.Second, false},
		{"missing min", map[string]any{}, 0, 0, true},
		{"zero min", map[string]any{"minMember": int64(0)}, 0, 0, true},
		{"string min", map[string]any{"minMember": "3"}, 0, 0, true},
		{"fractional", map[string]any{"minMember": 2.5}, 0, 0, true},
		{"negative timeout", map[string]any{"minMember": int64(1), "scheduleTimeoutSeconds": int64(-5)}, 0, 0, true},
		{"huge timeout", map[string]any{"minMember": int64(1), "scheduleTimeoutSeconds": int64(1 << 40)}, 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := parsePodGroup(&unstructured.Unstructured{Object: map[string]any{"spec": tc.spec}})
			if (got.err != nil) != tc.bad || (!tc.bad && (got.minMember != tc.min || got.timeout != tc.timeout)) {
				t.Fatalf("got %+v", got)
			}
			if tc.bad && !errors.Is(got.err, ErrInvalidGang) {
				t.Fatalf("error %v does not wrap ErrInvalidGang", got.err)
			}
		})
	}
}

func FuzzParseMinMember(f *testing.F) {
	for _, s := range []string{"1", "10000", "0", "-1", " 3 ", "1e3", "", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMinMember(s)
		if err == nil && (m < 1 || m > contract.MaxGangSize) {
			t.Fatalf("%q accepted as %d", s, m)
		}
		if err != nil && !errors.Is(err, ErrInvalidGang) {
			t.Fatalf("error %v does not wrap ErrInvalidGang", err)
		}
	})
}

func TestSlimPodGroup(t *testing.T) {
	t.Parallel()
	for _, spec := range []any{
		map[string]any{"minMember": int64(3), "scheduleTimeoutSeconds": int64(30), "queue": "q", "minResources": map[string]any{"cpu": "1"}},
		map[string]any{"minMember": "three"},
		nil, []any{int64(1)},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
			"metadata": map[string]any{"name": "g", "namespace": "ns", "uid": "u", "resourceVersion": "9",
				"managedFields": []any{map[string]any{"manager": "x"}}},
			"spec":   spec,
			"status": map[string]any{"phase": "Running", "running": int64(3)},
		}}
		su := SlimPodGroup(u)
		if !reflect.DeepEqual(parsePodGroup(su), parsePodGroup(u)) ||
			!reflect.DeepEqual(parseVolcanoPodGroup(su), parseVolcanoPodGroup(u)) {
			t.Errorf("spec %v: the slim PodGroup decodes differently", spec)
		}
		if su.GetName() != "g" || su.GetNamespace() != "ns" || su.GetResourceVersion() != "9" || su.Object["status"] != nil ||
			su.GetManagedFields() != nil {
			t.Errorf("spec %v: slim PodGroup %v", spec, su.Object)
		}
	}
}
