package podsource

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podYAML returns a valid static pod manifest.
func podYAML(name, uid string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\n  uid: " + uid +
		"\n  annotations:\n    understory.io/qos: BE\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
}

func TestParseManifest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		data    string
		wantErr error  // nil: must succeed
		errHas  string // substring of the error message
		check   func(t *testing.T, p *corev1.Pod)
	}{
		{
			name: "yaml defaults namespace",
			data: podYAML("web", "uid-1"),
			check: func(t *testing.T, p *corev1.Pod) {
				if p.Name != "web" || p.UID != "uid-1" || p.Namespace != "default" {
					t.Errorf("got %s/%s uid %s", p.Namespace, p.Name, p.UID)
				}
				if p.Annotations["understory.io/qos"] != "BE" || len(p.Spec.Containers) != 1 {
					t.Errorf("annotations/spec not decoded: %+v", p)
				}
				if p.Spec.NodeName != "" {
					t.Errorf("nodeName defaulted to %q", p.Spec.NodeName)
				}
			},
		},
		{
			name: "json with namespace",
			data: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"kube-system","uid":"6a1b_c.d-E"}}`,
			check: func(t *testing.T, p *corev1.Pod) {
				if p.Namespace != "kube-system" || p.UID != "6a1b_c.d-E" {
					t.Errorf("got %s uid %s", p.Namespace, p.UID)
				}
			},
		},
		{
			name: "leading document marker and comments",
			data: "# static pod\n---\n" + podYAML("web", "u") + "---\n# trailing\n",
			check: func(t *testing.T, p *corev1.Pod) {
				if p.Name != "web" {
					t.Errorf("name %q", p.Name)
				}
			},
		},
		{name: "empty", data: "", wantErr: ErrInvalidManifest, errHas: "no pod"},
		{name: "comments only", data: "# nothing\n", wantErr: ErrInvalidManifest, errHas: "no pod"},
		{name: "two documents", data: podYAML("a", "1") + "---\n" + podYAML("b", "2"), wantErr: ErrInvalidManifest, errHas: "2 YAML documents"},
		{name: "not yaml", data: "kind: [Pod\n", wantErr: ErrInvalidManifest},
		{name: "list", data: "- 1\n- 2\n", wantErr: ErrInvalidManifest},
		{name: "wrong kind", data: strings.Replace(podYAML("a", "1"), "kind: Pod", "kind: Deployment", 1), wantErr: ErrInvalidManifest, errHas: `kind is "Deployment"`},
		{name: "missing kind", data: strings.Replace(podYAML("a", "1"), "kind: Pod\n", "", 1), wantErr: ErrInvalidManifest, errHas: "kind"},
		{name: "wrong apiVersion", data: strings.Replace(podYAML("a", "1"), "apiVersion: v1", "apiVersion: apps/v1", 1), wantErr: ErrInvalidManifest, errHas: "apiVersion"},
		{name: "missing name", data: "apiVersion: v1\nkind: Pod\nmetadata:\n  uid: x\n", wantErr: ErrInvalidManifest, errHas: "metadata.name is required"},
		{name: "bad name", data: podYAML("Web_1", "x"), wantErr: ErrInvalidManifest, errHas: "metadata.name"},
		{name: "bad namespace", data: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  namespace: A.B\n  uid: x\n", wantErr: ErrInvalidManifest, errHas: "metadata.namespace"},
		{name: "missing uid", data: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n", wantErr: ErrInvalidManifest, errHas: "metadata.uid is required"},
		{name: "uid with slash", data: podYAML("a", "../../etc"), wantErr: ErrInvalidManifest, errHas: "metadata.uid"},
		{name: "uid dotdot", data: podYAML("a", `".."`), wantErr: ErrInvalidManifest, errHas: `".."`},
		{name: "uid dot", data: podYAML("a", `"."`), wantErr: ErrInvalidManifest, errHas: `"."`},
		{name: "uid space", data: podYAML("a", `"a b"`), wantErr: ErrInvalidManifest, errHas: "metadata.uid"},
		{name: "uid too long", data: podYAML("a", strings.Repeat("a", MaxUIDLength+1)), wantErr: ErrInvalidManifest, errHas: "longer than"},
		{name: "uid at limit", data: podYAML("a", strings.Repeat("a", MaxUIDLength)), check: func(t *testing.T, p *corev1.Pod) {
			if len(p.UID) != MaxUIDLength {
				t.Errorf("uid length %d", len(p.UID))
			}
		}},
		{name: "alias bomb", data: "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n" +
			"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n" +
			"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n", wantErr: ErrInvalidManifest},
		{name: "too large", data: podYAML("a", "1") + "#" + strings.Repeat("x", MaxManifestSize), wantErr: ErrManifestTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := ParseManifest("/m/pod.yaml", []byte(tc.data))
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("ParseManifest: %v", err)
				}
				tc.check(t, p)
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if p != nil {
				t.Errorf("pod returned with error: %+v", p)
			}
			if !strings.Contains(err.Error(), "/m/pod.yaml") {
				t.Errorf("error does not name the file: %v", err)
			}
			if tc.errHas != "" && !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("error %q does not contain %q", err, tc.errHas)
			}
		})
	}
}

func TestValidateUID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		uid types.UID
		ok  bool
	}{
		{"0b7e5b7c-5f7a-4e0b-9a37-3f3c3e2f9d11", true},
		{"a.b_c-D", true},
		{"...", true},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"a\x00b", false},
		{"é", false},
		{types.UID(strings.Repeat("x", 129)), false},
	}
	for _, tc := range tests {
		if err := validateUID(tc.uid); (err == nil) != tc.ok {
			t.Errorf("validateUID(%q) = %v, want ok=%v", tc.uid, err, tc.ok)
		}
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(podYAML("web", "uid-1")))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","uid":"b"}}`))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte(podYAML("a", "1") + "---\n" + podYAML("b", "2")))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseManifest("f.yaml", data)
		if err != nil {
			if p != nil {
				t.Fatalf("pod and error both returned")
			}
			if !errors.Is(err, ErrInvalidManifest) && !errors.Is(err, ErrManifestTooLarge) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		// Whatever is accepted must satisfy the static-pod invariants.
		if p.Kind != "Pod" || p.APIVersion != "v1" || p.Name == "" || p.Namespace == "" {
			t.Fatalf("accepted invalid pod: %+v", p.TypeMeta)
		}
		if err := validateUID(p.UID); err != nil || p.UID == "" {
			t.Fatalf("accepted bad uid %q", p.UID)
		}
	})
}
