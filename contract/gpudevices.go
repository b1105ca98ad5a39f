package contract

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxGPUDevicesAnnotation bounds the AnnotationGPUDevices value ParseGPUDevices reads
// (64 indices of two digits and their commas take 191 bytes).
const MaxGPUDevicesAnnotation = 512

// ErrInvalidGPUDevices is wrapped by ParseGPUDevices for a value that is not a list of
// distinct device indices.
var ErrInvalidGPUDevices = errors.New("invalid " + AnnotationGPUDevices + " value")

// ParseGPUDevices parses an AnnotationGPUDevices value: comma-separated, distinct device
// indices in 0..MaxGPUsPerNode-1, in the order written, blanks around each allowed, at
// most MaxGPUDevicesAnnotation bytes. It is stricter than strconv.Atoi: ASCII digits
// only (at most three), no sign. Errors wrap ErrInvalidGPUDevices. The extender (its
// ledger, resumed gang plans) and the agent's NRI plugin both read the annotation with
// it: one language on both sides of the wire.
func ParseGPUDevices(s string) ([]int, error) {
	if len(s) > MaxGPUDevicesAnnotation {
		return nil, fmt.Errorf("%d bytes exceed %d: %w", len(s), MaxGPUDevicesAnnotation, ErrInvalidGPUDevices)
	}
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty device list: %w", ErrInvalidGPUDevices)
	}
	var (
		seen uint64
		out  []int
	)
	for p := range strings.SplitSeq(s, ",") {
		d, ok := ParseGPUIndex(strings.TrimSpace(p))
		if !ok {
			return nil, fmt.Errorf("device %q is not an index in 0..%d: %w", p, MaxGPUsPerNode-1,
				ErrInvalidGPUDevices)
		}
		if seen&(1<<uint(d)) != 0 {
			return nil, fmt.Errorf("device %d twice: %w", d, ErrInvalidGPUDevices)
		}
		seen |= 1 << uint(d)
		out = append(out, d)
	}
	return out, nil
}

// ParseGPUIndex parses one device index as the annotation writes it: 1..3 ASCII digits
// (no sign, no blanks) below MaxGPUsPerNode. The agent reads the indices that NVIDIA's
// device plugin reports (DEVICE_ID_STRATEGY=index) with it too.
func ParseGPUIndex(s string) (int, bool) {
	if s == "" || len(s) > 3 {
		return 0, false
	}
	d := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		d = 10*d + int(s[i]-'0')
	}
	return d, d < MaxGPUsPerNode
}

// FormatGPUDevices renders device indices as an AnnotationGPUDevices value, which
// ParseGPUDevices reads back (for distinct indices in range).
func FormatGPUDevices(devs []int) string {
	var b strings.Builder
	for i, d := range devs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(d))
	}
	return b.String()
}
