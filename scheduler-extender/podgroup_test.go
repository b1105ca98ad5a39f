package extender

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	if spec.minMember < 1 || spec.minMember > MaxGangSize {
		t.Fatalf("%s: minMember %d accepted", what, spec.minMember)
	}
	if spec.timeout < 0 || spec.timeout > maxScheduleTimeout || spec.timeout%time.Second != 0 {
		t.Fatalf("%s: timeout %v accepted", what, spec.timeout)
	}
}

// FuzzPodGroupDecoders feeds PodGroup documents, decoded as the dynamic
// informer decodes them (unstructured JSON: integral numbers become int64,
// others float64), to the decoders of the scheduler-plugins and Volcano
// PodGroups and to the index. A PodGroup is outside input: anyone allowed to
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
	srv, err := NewServer(DefaultConfig(), Deps{})
	if err != nil {
		f.Fatal(err)
	}
	st := srv.Gangs()
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
		opts := []podOpt{}
		set := func(k, v string, anno bool) {
			if v == "" {
				return
			}
			if anno {
				opts = append(opts, annotate(k, v))
			} else {
				opts = append(opts, label(k, v))
			}
		}
		set(LabelPodGroup, pgLabel, false)
		set(AnnotationVolcanoGroupName, vName, true)
		set(AnnotationVolcanoMinMember, vMin, true)
		set(AnnotationKoordinatorName, kName, true)
		set(AnnotationKoordinatorMinAvailable, kMin, true)
		ref, ok := podGang(testPod("ns", "p", opts...))
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
		case ref.dialect == DialectKoordinator && (ref.min < 1 || ref.min > MaxGangSize):
			t.Fatalf("koordinator min-available %q accepted as %d", kMin, ref.min)
		case ref.min < 0 || ref.min > MaxGangSize:
			t.Fatalf("minMember %d accepted", ref.min)
		}
	})
}
