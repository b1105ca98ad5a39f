//go:build !cgo

package gpu

import (
	"fmt"
	"log/slog"
)

// Open reports ErrNoNVML: this binary was built without cgo, which NVML needs (the
// pure-Go build runs with GPU features off). Build with CGO_ENABLED=1 for GPUs.
func Open(procRoot string, log *slog.Logger) (Source, error) {
	return nil, fmt.Errorf("built without cgo: %w", ErrNoNVML)
}
