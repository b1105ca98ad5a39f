package pci

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fakeSys writes devices (address -> vendor, class) under a sysfs-shaped tree, as
// symlinks into a devices directory the way the kernel lays them out.
func fakeSys(t *testing.T, devices map[string][2]string) string {
	t.Helper()
	root := t.TempDir()
	list := filepath.Join(root, "bus", "pci", "devices")
	if err := os.MkdirAll(list, 0o755); err != nil {
		t.Fatal(err)
	}
	for addr, vc := range devices {
		real := filepath.Join(root, "devices", "pci0000:00", addr)
		if err := os.MkdirAll(real, 0o755); err != nil {
			t.Fatal(err)
		}
		if vc[0] != "" {
			if err := os.WriteFile(filepath.Join(real, "vendor"), []byte(vc[0]+"\n"), 0o444); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(real, "class"), []byte(vc[1]+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(real, filepath.Join(list, addr)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestNVIDIAGPUs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		devices map[string][2]string
		want    []string
	}{
		{"no PCI devices", map[string][2]string{}, nil},
		{"an H100 and its NVSwitch", map[string][2]string{
			"0000:18:00.0": {"0x10de", "0x030200"}, // 3D controller
			"0000:05:00.0": {"0x10de", "0x068000"}, // NVSwitch bridge
			"0000:00:1f.0": {"0x8086", "0x060100"},
		}, []string{"0000:18:00.0"}},
		{"a workstation card and its audio", map[string][2]string{
			"0000:01:00.0": {"0x10DE", "0x030000"}, // VGA, upper case
			"0000:01:00.1": {"0x10de", "0x040300"}, // HDMI audio
		}, []string{"0000:01:00.0"}},
		{"another vendor's GPU", map[string][2]string{"0000:03:00.0": {"0x1002", "0x030200"}}, nil},
		{"a device without a vendor file", map[string][2]string{"0000:04:00.0": {"", "0x030200"}}, nil},
		{"eight GPUs", map[string][2]string{
			"0000:1b:00.0": {"0x10de", "0x030200"}, "0000:18:00.0": {"0x10de", "0x030200"},
			"0000:29:00.0": {"0x10de", "0x030200"}, "0000:2a:00.0": {"0x10de", "0x030200"},
			"0000:9a:00.0": {"0x10de", "0x030200"}, "0000:9b:00.0": {"0x10de", "0x030200"},
			"0000:ba:00.0": {"0x10de", "0x030200"}, "0000:bb:00.0": {"0x10de", "0x030200"},
		}, []string{"0000:18:00.0", "0000:1b:00.0", "0000:29:00.0", "0000:2a:00.0", "0000:9a:00.0", "0000:9b:00.0", "0000:ba:00.0", "0000:bb:00.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := NVIDIAGPUs(fakeSys(t, tc.devices))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNVIDIAGPUsWithoutPCI(t *testing.T) {
	t.Parallel()
	got, err := NVIDIAGPUs(t.TempDir())
	if err != nil || got != nil {
		t.Fatalf("a sysfs without bus/pci: %v, %v; want none and no error", got, err)
	}
}

// On this machine the scan runs against the real sysfs and finds what lspci would
// (the test machine may have no NVIDIA GPU: then none).
func TestNVIDIAGPUsRealSysfs(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/sys/bus/pci/devices"); err != nil {
		t.Skipf("no PCI sysfs here: %v", err)
	}
	if _, err := NVIDIAGPUs("/sys"); err != nil {
		t.Fatal(err)
	}
}
