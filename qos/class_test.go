package qos_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/qos"
)

func TestParseClass(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    qos.Class
		wantErr bool
	}{
		{in: "LS", want: qos.ClassLS},
		{in: "ls", want: qos.ClassLS},
		{in: "lS", want: qos.ClassLS},
		{in: "BE", want: qos.ClassBE},
		{in: "be", want: qos.ClassBE},
		{in: "Be", want: qos.ClassBE},
		{in: "batch", want: qos.ClassBatch},
		{in: "BATCH", want: qos.ClassBatch},
		{in: "BaTcH", want: qos.ClassBatch},
		{in: "", wantErr: true},
		{in: " LS", wantErr: true},
		{in: "LS ", wantErr: true},
		{in: "LSE", wantErr: true}, // Koordinator value, not ours
		{in: "BestEffort", wantErr: true},
		{in: "batches", wantErr: true},
		{in: "L\u017f", wantErr: true},    // "ſ" folds to "s" under Unicode rules
		{in: "bat\u0441h", wantErr: true}, // Cyrillic es
		{in: "\xff\xfe", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := qos.ParseClass(tt.in)
			if tt.wantErr {
				if !errors.Is(err, qos.ErrInvalidClass) {
					t.Fatalf("ParseClass(%q) err = %v, want ErrInvalidClass", tt.in, err)
				}
				if got != "" {
					t.Errorf("ParseClass(%q) = %q on error, want empty", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseClass(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
			if !got.Valid() || got.String() != string(tt.want) {
				t.Errorf("class %q: Valid=%v String=%q", got, got.Valid(), got.String())
			}
		})
	}
}

func TestParseKoordinatorClass(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    qos.Class
		wantErr bool
	}{
		{in: "LSE", want: qos.ClassLS},
		{in: "lse", want: qos.ClassLS},
		{in: "LSR", want: qos.ClassLS},
		{in: "Lsr", want: qos.ClassLS},
		{in: "LS", want: qos.ClassLS},
		{in: "ls", want: qos.ClassLS},
		{in: "SYSTEM", want: qos.ClassLS},
		{in: "system", want: qos.ClassLS},
		{in: "BE", want: qos.ClassBatch},
		{in: "be", want: qos.ClassBatch},
		{in: "", wantErr: true},
		{in: "batch", wantErr: true},
		{in: "NONE", wantErr: true},
		{in: "LSX", wantErr: true},
		{in: "SYSTEM\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := qos.ParseKoordinatorClass(tt.in)
			if tt.wantErr {
				if !errors.Is(err, qos.ErrInvalidClass) {
					t.Fatalf("ParseKoordinatorClass(%q) err = %v, want ErrInvalidClass", tt.in, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseKoordinatorClass(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestClassValid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		c    qos.Class
		want bool
	}{
		{qos.ClassLS, true}, {qos.ClassBE, true}, {qos.ClassBatch, true},
		{"", false}, {"ls", false}, {"Batch", false}, {"LSE", false},
	}
	for _, tt := range tests {
		if got := tt.c.Valid(); got != tt.want {
			t.Errorf("Class(%q).Valid() = %v, want %v", tt.c, got, tt.want)
		}
	}
}

// res builds ResourceRequirements from "cpu=1,memory=1Gi" style strings.
func res(requests, limits string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: list(requests), Limits: list(limits)}
}

func list(s string) corev1.ResourceList {
	if s == "" {
		return nil
	}
	out := corev1.ResourceList{}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		out[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return out
}

func podWith(annotations, labels map[string]string, containers ...corev1.ResourceRequirements) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "p", Namespace: "ns", Annotations: annotations, Labels: labels,
	}}
	for _, r := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c", Resources: r})
	}
	return p
}

// Fresh values per call: tests run in parallel and ResourceLists are maps.
func guaranteed() corev1.ResourceRequirements { return res("cpu=1,memory=1Gi", "cpu=1,memory=1Gi") }
func burstable() corev1.ResourceRequirements  { return res("cpu=100m", "") }
func bestEffort() corev1.ResourceRequirements { return res("", "") }

func TestClassify(t *testing.T) {
	t.Parallel()
	const (
		uq = contract.AnnotationQOSClass
		kq = qos.AnnotationKoordinatorQOS
	)
	huge := strings.Repeat("x", 300_000)
	tests := []struct {
		name        string
		annotations map[string]string
		labels      map[string]string
		res         corev1.ResourceRequirements
		want        qos.Class
		// wantErrIn lists substrings the error must contain; nil = no error.
		wantErrIn []string
	}{
		// Kubernetes QoS fallback.
		{name: "guaranteed->LS", res: guaranteed(), want: qos.ClassLS},
		{name: "burstable->LS", res: burstable(), want: qos.ClassLS},
		{name: "besteffort->BE", res: bestEffort(), want: qos.ClassBE},

		// Understory annotation, every value and case.
		{name: "uq LS", annotations: map[string]string{uq: "LS"}, res: bestEffort(), want: qos.ClassLS},
		{name: "uq ls", annotations: map[string]string{uq: "ls"}, res: bestEffort(), want: qos.ClassLS},
		{name: "uq BE", annotations: map[string]string{uq: "BE"}, res: guaranteed(), want: qos.ClassBE},
		{name: "uq be", annotations: map[string]string{uq: "be"}, res: guaranteed(), want: qos.ClassBE},
		{name: "uq batch", annotations: map[string]string{uq: "batch"}, res: guaranteed(), want: qos.ClassBatch},
		{name: "uq Batch", annotations: map[string]string{uq: "Batch"}, res: guaranteed(), want: qos.ClassBatch},

		// Koordinator label, every value.
		{name: "kl LSE", labels: map[string]string{kq: "LSE"}, res: bestEffort(), want: qos.ClassLS},
		{name: "kl LSR", labels: map[string]string{kq: "LSR"}, res: bestEffort(), want: qos.ClassLS},
		{name: "kl LS", labels: map[string]string{kq: "LS"}, res: bestEffort(), want: qos.ClassLS},
		{name: "kl SYSTEM", labels: map[string]string{kq: "SYSTEM"}, res: bestEffort(), want: qos.ClassLS},
		{name: "kl system", labels: map[string]string{kq: "system"}, res: bestEffort(), want: qos.ClassLS},
		{name: "kl BE", labels: map[string]string{kq: "BE"}, res: guaranteed(), want: qos.ClassBatch},
		{name: "kl be", labels: map[string]string{kq: "be"}, res: guaranteed(), want: qos.ClassBatch},
		// Koordinator annotation (fallback when there is no label).
		{name: "ka BE", annotations: map[string]string{kq: "BE"}, res: guaranteed(), want: qos.ClassBatch},
		{name: "ka lse", annotations: map[string]string{kq: "lse"}, res: bestEffort(), want: qos.ClassLS},

		// Precedence.
		{name: "uq beats koord label", annotations: map[string]string{uq: "LS"}, labels: map[string]string{kq: "BE"},
			res: bestEffort(), want: qos.ClassLS},
		{name: "uq beats kube", annotations: map[string]string{uq: "batch"}, res: guaranteed(), want: qos.ClassBatch},
		{name: "koord label beats koord annotation", annotations: map[string]string{kq: "LS"},
			labels: map[string]string{kq: "BE"}, res: guaranteed(), want: qos.ClassBatch},
		{name: "koord beats kube", labels: map[string]string{kq: "LSR"}, res: bestEffort(), want: qos.ClassLS},
		{name: "unrelated keys ignored", annotations: map[string]string{"other.io/qos-class": "batch"},
			labels: map[string]string{uq: "batch"}, res: guaranteed(), want: qos.ClassLS},

		// Consumers of the batch resources are batch without an annotation.
		{name: "batch-cpu request->batch", res: res("understory.io/batch-cpu=500", "understory.io/batch-cpu=500"),
			want: qos.ClassBatch},
		{name: "batch-memory limit only->batch", res: res("", "understory.io/batch-memory=1Gi"), want: qos.ClassBatch},
		{name: "Koordinator batch-cpu->batch", res: res("kubernetes.io/batch-cpu=500", "kubernetes.io/batch-cpu=500"),
			want: qos.ClassBatch},
		{name: "Koordinator batch-memory limit->batch", res: res("", "kubernetes.io/batch-memory=1Gi"), want: qos.ClassBatch},
		{name: "uq LS beats batch resources", annotations: map[string]string{uq: "LS"},
			res: res("understory.io/batch-cpu=500", ""), want: qos.ClassLS},
		{name: "koord LS beats batch resources", labels: map[string]string{kq: "LS"},
			res: res("understory.io/batch-cpu=500", ""), want: qos.ClassLS},
		{name: "bad uq with batch resources is batch", annotations: map[string]string{uq: "gold"},
			res: res("understory.io/batch-memory=1Gi", ""), want: qos.ClassBatch, wantErrIn: []string{`"gold"`}},

		// Invalid values keep the class of the lower sources and report.
		{name: "bad uq keeps kube LS", annotations: map[string]string{uq: "gold"}, res: guaranteed(),
			want: qos.ClassLS, wantErrIn: []string{"annotation " + uq, `"gold"`}},
		{name: "bad uq keeps kube BE", annotations: map[string]string{uq: "gold"}, res: bestEffort(),
			want: qos.ClassBE, wantErrIn: []string{"annotation " + uq, `"gold"`}},
		{name: "empty uq keeps kube", annotations: map[string]string{uq: ""}, res: bestEffort(),
			want: qos.ClassBE, wantErrIn: []string{"annotation " + uq, `""`}},
		{name: "bad uq falls to koord", annotations: map[string]string{uq: "LSE"}, labels: map[string]string{kq: "BE"},
			res: guaranteed(), want: qos.ClassBatch, wantErrIn: []string{"annotation " + uq, `"LSE"`}},
		{name: "bad koord label keeps kube", labels: map[string]string{kq: "batch"}, res: guaranteed(),
			want: qos.ClassLS, wantErrIn: []string{"label " + kq, `"batch"`}},
		{name: "bad koord label falls to koord annotation", labels: map[string]string{kq: "X"},
			annotations: map[string]string{kq: "BE"}, res: guaranteed(),
			want: qos.ClassBatch, wantErrIn: []string{"label " + kq, `"X"`}},
		{name: "bad everywhere keeps kube and names all", annotations: map[string]string{uq: "u1", kq: "k2"},
			labels: map[string]string{kq: "k1"}, res: bestEffort(), want: qos.ClassBE,
			wantErrIn: []string{"annotation " + uq, `"u1"`, "label " + kq, `"k1"`, "annotation " + kq, `"k2"`}},
		{name: "huge value truncated", annotations: map[string]string{uq: huge}, res: guaranteed(),
			want: qos.ClassLS, wantErrIn: []string{"annotation " + uq, "(300000 bytes)"}},
		{name: "control bytes escaped", annotations: map[string]string{uq: "LS\n\x1b[31m"}, res: bestEffort(),
			want: qos.ClassBE, wantErrIn: []string{`"LS\n\x1b[31m"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := qos.Classify(podWith(tt.annotations, tt.labels, tt.res))
			if got != tt.want {
				t.Errorf("class = %q, want %q", got, tt.want)
			}
			if tt.wantErrIn == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, qos.ErrInvalidClass) {
				t.Fatalf("err = %v, want ErrInvalidClass", err)
			}
			for _, s := range tt.wantErrIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if len(err.Error()) > 1024 {
				t.Errorf("error message is %d bytes, want it truncated", len(err.Error()))
			}
			if strings.ContainsAny(strings.ReplaceAll(err.Error(), "\n", ""), "\x1b\r") {
				t.Errorf("error message carries raw control bytes: %q", err)
			}
		})
	}
}

func TestClassifyNilPod(t *testing.T) {
	t.Parallel()
	c, err := qos.Classify(nil)
	if !errors.Is(err, qos.ErrNilPod) || c != "" {
		t.Fatalf("Classify(nil) = %q, %v; want \"\", ErrNilPod", c, err)
	}
}

func TestClassifyUsesStatusQOS(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status corev1.PodQOSClass
		res    corev1.ResourceRequirements
		want   qos.Class
	}{
		// Status wins over the spec (it was computed at creation).
		{"status BestEffort over guaranteed() spec", corev1.PodQOSBestEffort, guaranteed(), qos.ClassBE},
		{"status Guaranteed over empty spec", corev1.PodQOSGuaranteed, bestEffort(), qos.ClassLS},
		{"status Burstable", corev1.PodQOSBurstable, bestEffort(), qos.ClassLS},
		// A status value we do not know falls back to the spec.
		{"unknown status, besteffort spec", "Platinum", bestEffort(), qos.ClassBE},
		{"unknown status, guaranteed() spec", "Platinum", guaranteed(), qos.ClassLS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := podWith(nil, nil, tt.res)
			p.Status.QOSClass = tt.status
			got, err := qos.Classify(p)
			if err != nil || got != tt.want {
				t.Fatalf("Classify = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// FuzzParseClass checks that the parser accepts exactly the three names in
// any ASCII case, and that errors stay short.
func FuzzParseClass(f *testing.F) {
	for _, s := range []string{"LS", "be", "BATCH", "", "L\u017f", "batch\x00", strings.Repeat("é", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := qos.ParseClass(s)
		lower := strings.ToLower(s)
		wantOK := (lower == "ls" || lower == "be" || lower == "batch") && isASCII(s)
		if wantOK != (err == nil) {
			t.Fatalf("ParseClass(%q) = %q, %v; want ok=%v", s, c, err, wantOK)
		}
		if err != nil {
			if !errors.Is(err, qos.ErrInvalidClass) {
				t.Fatalf("error %v does not wrap ErrInvalidClass", err)
			}
			if len(err.Error()) > 400 {
				t.Fatalf("error message is %d bytes", len(err.Error()))
			}
			return
		}
		if !c.Valid() || !strings.EqualFold(string(c), s) {
			t.Fatalf("ParseClass(%q) = %q", s, c)
		}
	})
}

// FuzzClassify checks the annotation contract: the class is always valid, a
// bad value is reported and changes nothing compared with leaving it out.
func FuzzClassify(f *testing.F) {
	f.Add("LS", "BE", "", true, false)
	f.Add("gold", "BE", "LS", true, true)
	f.Add("batch", "", "SYSTEM", false, true)
	f.Add("\xff", "lsr", "x", true, true)
	f.Fuzz(func(t *testing.T, uqVal, klVal, kaVal string, hasKL, guaranteedSpec bool) {
		ann := map[string]string{contract.AnnotationQOSClass: uqVal}
		if kaVal != "" {
			ann[qos.AnnotationKoordinatorQOS] = kaVal
		}
		var labels map[string]string
		if hasKL {
			labels = map[string]string{qos.LabelKoordinatorQOS: klVal}
		}
		r := bestEffort()
		if guaranteedSpec {
			r = guaranteed()
		}
		pod := podWith(ann, labels, r)
		c, err := qos.Classify(pod)
		if !c.Valid() {
			t.Fatalf("invalid class %q (err %v)", c, err)
		}
		if err != nil && !errors.Is(err, qos.ErrInvalidClass) {
			t.Fatalf("error %v does not wrap ErrInvalidClass", err)
		}
		if err != nil && len(err.Error()) > 3*400 {
			t.Fatalf("error message is %d bytes", len(err.Error()))
		}
		if want, perr := qos.ParseClass(uqVal); perr == nil {
			if c != want || err != nil {
				t.Fatalf("valid annotation %q: got %q, %v; want %q", uqVal, c, err, want)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), contract.AnnotationQOSClass) {
			t.Fatalf("bad annotation %q not reported: %v", uqVal, err)
		}
		// Without the bad annotation the class must be the same.
		without := pod.DeepCopy()
		delete(without.Annotations, contract.AnnotationQOSClass)
		c2, _ := qos.Classify(without)
		if c2 != c {
			t.Fatalf("bad annotation %q moved the pod: %q vs %q without it", uqVal, c, c2)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
