package mps

import (
	"errors"
	"strings"
	"testing"
)

// TestConfigRejectsHostShm: MPS clients get the shm directory mounted read-write at
// /dev/shm, so the host's own /dev/shm (every host process's POSIX shared memory)
// is refused with a message that says what to do, as are a pipe directory and an
// shm directory nested in each other and a root client UID; unset values take
// private, non-root defaults.
func TestConfigRejectsHostShm(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		bad  string // "" valid; else a phrase of the message
	}{
		{"host shm", Config{Mode: ModeFind, ShmDirectory: "/dev/shm"}, "host's shared memory"},
		{"host shm, mode disabled", Config{ShmDirectory: "/dev/shm"}, "its /dev/shm"},
		{"a directory of its own", Config{Mode: ModeFind, ShmDirectory: "/run/nvidia-mps-shm"}, ""},
		{"pipe inside shm", Config{PipeDirectory: "/run/mps/shm/pipe", ShmDirectory: "/run/mps/shm"}, "inside"},
		{"shm inside pipe", Config{PipeDirectory: "/run/mps", ShmDirectory: "/run/mps/shm"}, "inside"},
		{"siblings", Config{PipeDirectory: "/run/mps/pipe", ShmDirectory: "/run/mps/shm"}, ""},
		{"explicit non-root uid", Config{ClientUID: 2000}, ""},
	} {
		err := tc.cfg.Validate()
		if tc.bad == "" {
			if err != nil {
				t.Errorf("%s: Validate = %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.bad) ||
			!strings.Contains(err.Error(), "shmDirectory") && !strings.Contains(err.Error(), "pipeDirectory") {
			t.Errorf("%s: Validate = %v; want ErrInvalidConfig naming %q", tc.name, err, tc.bad)
		}
	}
	d := Config{}.WithDefaults()
	if d.ShmDirectory == HostShm || d.ClientUID == 0 || d.ClientUID != DefaultClientUID {
		t.Fatalf("defaults %+v: want a private shm directory and a non-root client UID", d)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}
