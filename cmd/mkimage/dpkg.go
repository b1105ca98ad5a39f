package main

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/understory/understory/images"
)

// errNoPackage: no installed Debian package owns the file.
var errNoPackage = errors.New("no package owns it")

// dpkgLookup returns the lookup of the Debian package a library copied from the
// build host comes from (images.ProjectOptions.Package), or nil where there is no
// dpkg-query or the libraries do not come from this host's root.
func dpkgLookup(libRoot string) func(string) (string, []byte, error) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		return nil
	}
	if filepath.Clean(libRoot) == "/" {
		return dpkgPackage
	}
	if strings.HasPrefix(filepath.Clean(libRoot), "/usr/") {
		return crossPackage // a Debian cross sysroot, /usr/<triplet>
	}
	return nil
}

// crossPackage is dpkgPackage for a library of a Debian cross sysroot: the file
// belongs to <package>-<arch>-cross (libc6-arm64-cross), dpkg-cross's repack of the
// architecture's own package at the version before "cross" (2.36-8cross1: libc6
// 2.36-8). The image carries that package as itself (libc6, arm64, 2.36-8), which is
// what its files are, so scanners judge the glibc it ships.
func crossPackage(hostPath string) (string, []byte, error) {
	name, stanza, err := dpkgPackage(hostPath)
	if err != nil {
		return "", nil, err
	}
	m := crossName.FindStringSubmatch(name)
	if m == nil {
		return name, stanza, nil
	}
	f := images.StanzaFields(string(stanza))
	version, _, _ := strings.Cut(f["Version"], "cross")
	out := "Package: " + m[1] + "\nStatus: install ok installed\nArchitecture: " + m[2] + "\nVersion: " + version +
		"\nSource: glibc\nDescription: " + m[1] + " for " + m[2] + ", from Debian's " + name + " " + f["Version"] + "\n"
	if m[1] != "libc6" {
		out = strings.Replace(out, "\nSource: glibc", "", 1)
	}
	return m[1] + ":" + m[2], []byte(out), nil
}

// crossName is a dpkg-cross package: <package>-<arch>-cross.
var crossName = regexp.MustCompile(`^(.+)-(amd64|arm64|armhf|ppc64el|riscv64|s390x)-cross$`)

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
