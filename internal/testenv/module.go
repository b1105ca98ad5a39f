package testenv

import (
	"fmt"
	"os"
	"path/filepath"
)

// ModuleRoot is the directory holding go.mod at or above the working directory: go
// test runs in the package's directory, and the tests and benchmarks read the
// module's manifests, scripts and outputs from its root.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod at or above %s: %w", dir, os.ErrNotExist)
		}
		dir = parent
	}
}
