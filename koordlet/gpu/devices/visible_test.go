package devices

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestVisible pins NVIDIA_VISIBLE_DEVICES to what a container was given, whatever its
// image or a tenant's spec sets: its shared devices, the device plugin's whole GPUs,
// or none; only a trusted pod keeps what its own spec sets.
func TestVisible(t *testing.T) {
	t.Parallel()
	all := []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"}
	p := pod(nil, ctr("shared", nil, list("understory.io/gpu-milli", "300")),
		ctr("whole", nil, list("nvidia.com/gpu", "1")), ctr("none", nil, nil))
	agent := pod(nil, ctr("agent", nil, nil))
	agent.Spec.Containers[0].Env = []corev1.EnvVar{{Name: EnvVisibleDevices, Value: "all"}}
	for _, tc := range []struct {
		name string
		c    VisibleContainer
		want string
	}{
		{"shared: its UUIDs over the image's all", VisibleContainer{Pod: p, Container: "shared",
			Shared: []GPU{{0, uuid0}, {3, uuid3}}, Env: all}, uuid0 + "," + uuid3},
		{"shared, no UUID: index", VisibleContainer{Pod: p, Container: "shared", Shared: []GPU{{Index: 1}}}, "1"},
		{"no GPU: void over the image's all", VisibleContainer{Pod: p, Container: "none", Env: all}, NoDevices},
		{"no GPU, nothing set: void", VisibleContainer{Pod: p, Container: "none"}, NoDevices},
		{"whole by CDI next to the image's all", VisibleContainer{Pod: p, Container: "whole", Env: all,
			CDI: []string{DefaultCDIKind + "=1"}, CDIKind: DefaultCDIKind, Inventory: inventory}, uuid1},
		{"whole by the device plugin's env", VisibleContainer{Pod: p, Container: "whole",
			Env: append(all[:2:2], "NVIDIA_VISIBLE_DEVICES=3"), CDIKind: DefaultCDIKind, Inventory: inventory}, uuid3},
		{"whole, MIG: left", VisibleContainer{Pod: p, Container: "whole",
			Env: []string{"NVIDIA_VISIBLE_DEVICES=MIG-1"}, CDIKind: DefaultCDIKind, Inventory: inventory}, ""},
		{"trusted pod's spec sets it: left", VisibleContainer{Pod: agent, Container: "agent", Env: all,
			TrustSpec: true}, ""},
		{"tenant's spec sets it: void", VisibleContainer{Pod: agent, Container: "agent", Env: all}, NoDevices},
		{"trusted, spec sets nothing: void", VisibleContainer{Pod: p, Container: "none", Env: all, TrustSpec: true},
			NoDevices},
		{"trusted shared: its UUIDs all the same", VisibleContainer{Pod: agent, Container: "agent",
			Shared: []GPU{{0, uuid0}}, Env: all, TrustSpec: true}, uuid0},
		{"unknown pod with all: void", VisibleContainer{Container: "x", Env: all}, NoDevices},
		{"unknown pod with a device list: left", VisibleContainer{Container: "x",
			Env: []string{"NVIDIA_VISIBLE_DEVICES=" + uuid0}}, ""},
		{"unknown pod, nothing set: left", VisibleContainer{Container: "x"}, ""},
	} {
		if got := Visible(tc.c); got != tc.want {
			t.Errorf("%s: Visible = %q, want %q", tc.name, got, tc.want)
		}
	}
}
