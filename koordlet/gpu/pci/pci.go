// Package pci finds a node's NVIDIA GPUs in sysfs, without the driver or NVML: what
// the pure-Go agent uses to tell that it runs on a GPU node the GPU agent missed (a
// node no GPU label marks), so that the GPUs there do not go unmanaged silently.
package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// VendorNVIDIA is NVIDIA's PCI vendor id, as sysfs writes it.
const VendorNVIDIA = "0x10de"

// Display controllers (PCI base class 0x03): VGA (0x0300) and 3D (0x0302), which is
// what data-centre GPUs report. NVIDIA's other functions (HDMI audio 0x0403,
// NVSwitch 0x0680, USB-C 0x0c03) are not GPUs.
var gpuClasses = []string{"0x0300", "0x0302"}

// NVIDIAGPUs returns the PCI addresses of the NVIDIA GPUs under sysRoot (the host's
// /sys, e.g. "/sys"), sorted. A system without PCI in sysfs has none; a device whose
// files cannot be read is skipped (it may be going away); an unreadable device list
// is an error.
func NVIDIAGPUs(sysRoot string) ([]string, error) {
	dir := filepath.Join(sysRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing PCI devices: %w", err)
	}
	var gpus []string
	for _, e := range entries {
		vendor, err1 := readID(filepath.Join(dir, e.Name(), "vendor"))
		class, err2 := readID(filepath.Join(dir, e.Name(), "class"))
		if err1 != nil || err2 != nil || vendor != VendorNVIDIA {
			continue
		}
		for _, c := range gpuClasses {
			if strings.HasPrefix(class, c) {
				gpus = append(gpus, e.Name())
				break
			}
		}
	}
	return gpus, nil
}

// readID reads a sysfs id file ("0x10de\n", "0x030200\n"), lower-cased.
func readID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.ToLower(strings.TrimSpace(string(b))), nil
}
