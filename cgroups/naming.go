package cgroups

import (
	"fmt"
	"path/filepath"
	"strings"
)

// validName checks a single path component taken from outside input (pod
// UID, tier name): 1..MaxNameLen bytes of [A-Za-z0-9._-], not starting with
// '.', no "..".
func validName(s string) error {
	if s == "" {
		return fmt.Errorf("empty name: %w", ErrInvalidPath)
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("name longer than %d bytes: %w", MaxNameLen, ErrInvalidPath)
	}
	if s[0] == '.' || strings.Contains(s, "..") {
		return fmt.Errorf("name starts with '.' or contains \"..\": %w", ErrInvalidPath)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("byte %q at %d is outside [A-Za-z0-9._-]: %w", c, i, ErrInvalidPath)
		}
	}
	return nil
}

// maxPathLen is PATH_MAX minus room for the root and a control-file name.
const maxPathLen = 3072

// nameMax is the kernel's NAME_MAX for one component.
const nameMax = 255

// CleanPath validates a relative cgroup path taken from outside input and
// returns it unchanged: it must be non-empty, relative, made of non-empty
// components that are neither "." nor "..", free of NUL and control bytes,
// each component at most 255 bytes, and equal to its filepath.Clean form (so
// it stays inside the root it is joined to). Anything else is ErrInvalidPath.
func CleanPath(rel string) (string, error) {
	if rel == "" {
		return "", fmt.Errorf("empty cgroup path: %w", ErrInvalidPath)
	}
	if len(rel) > maxPathLen {
		return "", fmt.Errorf("cgroup path longer than %d bytes: %w", maxPathLen, ErrInvalidPath)
	}
	if filepath.IsAbs(rel) {
		return "", fmt.Errorf("cgroup path %q is absolute: %w", rel, ErrInvalidPath)
	}
	for i := 0; i < len(rel); i++ {
		if c := rel[i]; c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("cgroup path %q has control byte %#x at %d: %w", rel, c, i, ErrInvalidPath)
		}
	}
	for _, comp := range strings.Split(rel, "/") {
		switch {
		case comp == "":
			return "", fmt.Errorf("cgroup path %q has an empty component: %w", rel, ErrInvalidPath)
		case comp == "." || comp == "..":
			return "", fmt.Errorf("cgroup path %q has a %q component: %w", rel, comp, ErrInvalidPath)
		case len(comp) > nameMax:
			return "", fmt.Errorf("cgroup path %q has a component longer than %d bytes: %w", rel, nameMax, ErrInvalidPath)
		}
	}
	clean := filepath.Clean(rel)
	if clean != rel || !filepath.IsLocal(clean) {
		return "", fmt.Errorf("cgroup path %q is not clean: %w", rel, ErrInvalidPath)
	}
	return clean, nil
}
