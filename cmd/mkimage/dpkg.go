package main

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
)

// errNoPackage: no installed Debian package owns the file.
var errNoPackage = errors.New("no package owns it")

// dpkgLookup returns the lookup of the Debian package a library copied from the
// build host comes from (images.ProjectOptions.Package), or nil where there is no
// dpkg-query or the libraries do not come from this host's root.
func dpkgLookup(libRoot string) func(string) (string, []byte, error) {
	if filepath.Clean(libRoot) != "/" {
		return nil
	}
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		return nil
	}
	return dpkgPackage
}

// dpkgPackage asks dpkg which package owns hostPath (as dpkg recorded it: /lib or
// /usr/lib, merged-/usr systems have both) and returns that package's status stanza.
func dpkgPackage(hostPath string) (string, []byte, error) {
	candidates := []string{hostPath}
	if real, err := filepath.EvalSymlinks(hostPath); err == nil && real != hostPath {
		candidates = append(candidates, real)
	}
	for _, p := range append([]string(nil), candidates...) {
		if rest, ok := strings.CutPrefix(p, "/usr/"); ok {
			candidates = append(candidates, "/"+rest)
		} else {
			candidates = append(candidates, "/usr"+p)
		}
	}
	for _, p := range candidates {
		out, err := exec.Command("dpkg-query", "-S", p).Output()
		if err != nil {
			continue
		}
		line, _, _ := strings.Cut(string(out), "\n")
		owners, _, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(owners, ", ")
		stanza, err := exec.Command("dpkg-query", "-s", name).Output()
		if err != nil || !bytes.Contains(stanza, []byte("Status: install ok installed")) {
			continue
		}
		return name, stanza, nil
	}
	return "", nil, errNoPackage
}
