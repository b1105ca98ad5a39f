package collect

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/understory/understory/cgroups"
	"golang.org/x/sys/unix"
)

// Sentinels of ReadPressure.
var (
	// ErrNoPSI: the kernel has no pressure stall information (no
	// CONFIG_PSI, or booted with psi=0).
	ErrNoPSI = errors.New("pressure stall information not available")
	// ErrUnknownResource: the resource is not cpu, memory or io.
	ErrUnknownResource = errors.New("unknown pressure resource")
)

// ReadPressure reads <procRoot>/pressure/<resource> for resource "cpu",
// "memory" or "io". A missing file yields an error wrapping ErrNoPSI.
func ReadPressure(procRoot, resource string) (cgroups.PSI, error) {
	switch resource {
	case "cpu", "memory", "io":
	default:
		return cgroups.PSI{}, fmt.Errorf("pressure resource %q: %w", resource, ErrUnknownResource)
	}
	path := filepath.Join(procRoot, "pressure", resource)
	f, err := os.Open(path)
	if err != nil {
		if noPSI(err) {
			return cgroups.PSI{}, fmt.Errorf("%w: %w", ErrNoPSI, err)
		}
		return cgroups.PSI{}, fmt.Errorf("reading %s pressure: %w", resource, err)
	}
	defer f.Close()
	p, err := cgroups.ParsePSI(f)
	if err != nil {
		if noPSI(err) {
			return cgroups.PSI{}, fmt.Errorf("%s: %w: %w", path, ErrNoPSI, err)
		}
		return cgroups.PSI{}, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// noPSI: the file is absent, or the kernel refuses to report (EOPNOTSUPP,
// as cgroup pressure files do with PSI disabled).
func noPSI(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EOPNOTSUPP)
}
