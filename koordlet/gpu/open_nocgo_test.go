//go:build !cgo

package gpu

import (
	"errors"
	"testing"
)

// TestOpenWithoutCgo: the pure-Go build runs with GPU features off.
func TestOpenWithoutCgo(t *testing.T) {
	t.Parallel()
	src, err := Open("/proc", nil)
	if !errors.Is(err, ErrNoNVML) || src != nil {
		t.Fatalf("Open = %v, %v; want ErrNoNVML", src, err)
	}
}
