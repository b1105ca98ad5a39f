//go:build !linux

package mps

import (
	"context"
	"errors"
	"os/exec"
)

// ShmStartArg is the hidden first argument with which the agent's own binary runs
// StartWithPrivateShm (Linux only).
const ShmStartArg = "__understory-mps-start"

const selfExe = ""

// ErrPrivateShm wraps every failure of StartWithPrivateShm.
var ErrPrivateShm = errors.New("cannot start the MPS control daemon with a private /dev/shm: Linux only")

func privateShmCommand(_ context.Context, _, _, _, _ string, _ ...string) (*exec.Cmd, error) {
	return nil, ErrPrivateShm
}

// StartWithPrivateShm needs Linux mount namespaces.
func StartWithPrivateShm([]string) error { return ErrPrivateShm }
