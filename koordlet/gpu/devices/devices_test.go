package devices

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	uuid0 = "GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	uuid1 = "GPU-1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b"
	uuid3 = "GPU-3c3c3c3c-5f60-4718-9a0b-1c2d3e4f5a6b"
)

var inventory = []GPU{{0, uuid0}, {1, uuid1}, {3, uuid3}}

func ctr(name string, req, lim corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}
}

func list(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func pod(ann map[string]string, ctrs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: ann},
		Spec: corev1.PodSpec{Containers: ctrs}}
}

func devs(v string) map[string]string { return map[string]string{AnnotationDevices: v} }

func TestDecide(t *testing.T) {
	t.Parallel()
	milli := ctr("main", list("understory.io/gpu-milli", "300"), nil)
	for _, tc := range []struct {
		name    string
		cfg     Config
		pod     *corev1.Pod
		ctr     string
		inv     []GPU
		ok      bool
		cdi     []string
		env     map[string]string
		wantErr error
	}{
		{"cdi by uuid (default)", Config{}, pod(devs("1"), milli), "main", inventory, true,
			[]string{"nvidia.com/gpu=" + uuid1}, nil, nil},
		{"cdi by index", Config{CDINames: NamingIndex}, pod(devs("3"), milli), "main", inventory, true,
			[]string{"nvidia.com/gpu=3"}, nil, nil},
		{"cdi other kind", Config{CDIKind: "example.com/gpu"}, pod(devs("0"), milli), "main", inventory, true,
			[]string{"example.com/gpu=" + uuid0}, nil, nil},
		{"env", Config{Mode: ModeEnv}, pod(devs("1"), milli), "main", inventory, true, nil,
			map[string]string{EnvVisibleDevices: uuid1}, nil},
		{"env, two devices in annotation order", Config{Mode: ModeEnv}, pod(devs(" 3, 0"), milli), "main", inventory,
			true, nil, map[string]string{EnvVisibleDevices: uuid3 + "," + uuid0}, nil},
		{"limit only", Config{}, pod(devs("0"), ctr("main", nil, list("understory.io/gpu-milli", "1000"))), "main",
			inventory, true, []string{"nvidia.com/gpu=" + uuid0}, nil, nil},
		{"init container", Config{}, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: devs("0")},
			Spec: corev1.PodSpec{InitContainers: []corev1.Container{milli}}}, "main", inventory, true,
			[]string{"nvidia.com/gpu=" + uuid0}, nil, nil},
		{"index naming needs no uuid", Config{CDINames: NamingIndex}, pod(devs("2"), milli), "main",
			[]GPU{{Index: 2}}, true, []string{"nvidia.com/gpu=2"}, nil, nil},

		// Untouched.
		{"no gpu request", Config{}, pod(devs("1"), ctr("main", list("cpu", "1"), nil)), "main", inventory, false,
			nil, nil, nil},
		{"whole gpus are the device plugin's", Config{}, pod(devs("1"), ctr("main", nil, list("nvidia.com/gpu", "1"))),
			"main", nil, false, nil, nil, nil},
		{"zero milli", Config{}, pod(nil, ctr("main", list("understory.io/gpu-milli", "0"), nil)), "main", inventory,
			false, nil, nil, nil},
		{"sidecar without request in a gpu pod", Config{}, pod(devs("1"), milli, ctr("log", nil, nil)), "log",
			inventory, false, nil, nil, nil},
		{"container not in the spec", Config{}, pod(devs("1"), milli), "debugger", inventory, false, nil, nil, nil},
		{"no pod", Config{}, nil, "main", inventory, false, nil, nil, nil},

		// Refused.
		{"no annotation", Config{}, pod(nil, milli), "main", inventory, false, nil, nil, ErrNoAnnotation},
		{"empty annotation", Config{}, pod(devs(""), milli), "main", inventory, false, nil, nil, ErrMalformed},
		{"malformed annotation", Config{}, pod(devs("gpu0"), milli), "main", inventory, false, nil, nil, ErrMalformed},
		{"absent device", Config{}, pod(devs("2"), milli), "main", inventory, false, nil, nil, ErrAbsentDevice},
		{"one of two absent", Config{}, pod(devs("0,7"), milli), "main", inventory, false, nil, nil, ErrAbsentDevice},
		{"no inventory", Config{}, pod(devs("0"), milli), "main", nil, false, nil, nil, ErrNoInventory},
		{"device without uuid", Config{Mode: ModeEnv}, pod(devs("2"), milli), "main", []GPU{{Index: 2}}, false, nil,
			nil, ErrAbsentDevice},
		{"inventory index twice", Config{}, pod(devs("0"), milli), "main", []GPU{{0, uuid0}, {0, uuid1}}, false, nil,
			nil, ErrBadInventory},
		{"inventory uuid with a comma", Config{Mode: ModeEnv}, pod(devs("0"), milli), "main",
			[]GPU{{0, uuid0 + ",GPU-x"}}, false, nil, nil, ErrBadInventory},
		{"inventory uuid twice", Config{}, pod(devs("0"), milli), "main", []GPU{{0, uuid0}, {1, uuid0}}, false, nil,
			nil, ErrBadInventory},
		{"whole and shared", Config{}, pod(devs("0"), ctr("main", list("understory.io/gpu-milli", "300",
			"nvidia.com/gpu", "1"), nil)), "main", inventory, false, nil, nil, ErrConflict},
		{"bad mode", Config{Mode: "all"}, pod(devs("0"), milli), "main", inventory, false, nil, nil, ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, ok, err := Decide(tc.cfg, tc.pod, tc.ctr, tc.inv)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || ok || a.CDIDevices != nil || a.Env != nil {
					t.Fatalf("Decide = %+v, %v, %v; want refusal %v", a, ok, err, tc.wantErr)
				}
				return
			}
			if err != nil || ok != tc.ok {
				t.Fatalf("Decide = %+v, %v, %v; want ok %v", a, ok, err, tc.ok)
			}
			if !reflect.DeepEqual(a.CDIDevices, tc.cdi) || !reflect.DeepEqual(a.Env, tc.env) {
				t.Fatalf("Decide = cdi %q env %v; want %q %v", a.CDIDevices, a.Env, tc.cdi, tc.env)
			}
			if ok && len(a.Devices) != len(tc.cdi)+strings.Count(tc.env[EnvVisibleDevices], ",")+min(1, len(tc.env)) {
				t.Fatalf("devices %+v do not match the output", a.Devices)
			}
		})
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, err := range []error{ErrNoAnnotation, ErrMalformed, ErrAbsentDevice, ErrNoInventory, ErrBadInventory,
		ErrConflict, ErrMPSPlanner, ErrMPSUnsafe, errors.New("other")} {
		r := Reason(errors.Join(errors.New("wrapped"), err))
		if r == "" || seen[r] || strings.ContainsAny(r, " :") {
			t.Fatalf("Reason(%v) = %q: want a distinct CamelCase reason", err, r)
		}
		seen[r] = true
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{}, true},
		{Config{Mode: ModeEnv, CDINames: NamingIndex, CDIKind: "nvidia.com/gpu"}, true},
		{Config{Mode: "CDI"}, false},
		{Config{CDINames: "type-index"}, false},
		{Config{CDIKind: "nvidia.com"}, false},
		{Config{CDIKind: "nvidia.com/gpu=0"}, false},
		{Config{CDIKind: "/gpu"}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("Validate(%+v) = %v, want ok %v", tc.cfg, err, tc.ok)
		}
	}
}

func TestResolveID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id   string
		want int // -1: none
	}{
		{uuid1, 1}, {"3", 3}, {uuid0 + "::2", 0}, {"1::0", 1}, {"2", -1}, {"MIG-1234", -1}, {"", -1}, {"::1", -1},
		{"GPU-unknown", -1},
	} {
		g, ok := ResolveID(inventory, tc.id)
		if ok != (tc.want >= 0) || ok && g.Index != tc.want {
			t.Errorf("ResolveID(%q) = %+v, %v; want index %d", tc.id, g, ok, tc.want)
		}
	}
	if _, ok := ResolveID([]GPU{{Index: 0}}, ""); ok {
		t.Error("an empty ID matched a device without UUID")
	}
}
