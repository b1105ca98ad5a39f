package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/understory/understory/images"
)

// released is one line of a release's images.json.
type released struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
	// Archive is the OCI archive's path relative to images.json.
	Archive string `json:"archive"`
	// Digest is the image index's digest: what a registry serves for Ref.
	Digest    string   `json:"digest"`
	Platforms []string `json:"platforms"`
	// SBOMs are the SPDX documents, one per platform, relative to images.json.
	SBOMs []string `json:"sboms"`
}

func release(args []string, stdout, stderr io.Writer, created time.Time) error {
	fs := flag.NewFlagSet("mkimage release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "image tag (the release's: VERSION, or VERSION-g<commit> for an untagged build); required")
	var bins listFlag
	fs.Var(&bins, "bin", "ARCH=DIR: the binaries built for GOARCH ARCH (repeat per architecture)")
	out := fs.String("out", "dist/images", "directory for <name>.oci.tar, sbom/ and images.json")
	var libRoots listFlag
	fs.Var(&libRoots, "lib-root", "[ARCH=]DIR: where a cgo binary's loader and libraries are copied from, for ARCH "+
		"(a cross sysroot such as /usr/aarch64-linux-gnu) or every architecture (default /)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *version == "" || len(bins) == 0 || fs.NArg() != 0 {
		return fmt.Errorf("%w: mkimage release -version V -bin ARCH=DIR [-bin ARCH=DIR]... [-out DIR] [-lib-root [ARCH=]DIR]...", errUsage)
	}
	dirs := map[string]string{}
	for _, b := range bins {
		arch, dir, ok := strings.Cut(b, "=")
		if !ok || arch == "" || dir == "" {
			return fmt.Errorf("%w: -bin %q: want ARCH=DIR", errUsage, b)
		}
		dirs[arch] = dir
	}
	roots := map[string]string{}
	defaultRoot := "/"
	for _, r := range libRoots {
		if arch, dir, ok := strings.Cut(r, "="); ok {
			roots[arch] = dir
		} else {
			defaultRoot = r
		}
	}
	libRoot := func(arch string) string {
		if r, ok := roots[arch]; ok {
			return r
		}
		return defaultRoot
	}
	arches := make([]string, 0, len(dirs))
	for a := range dirs {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	if err := os.MkdirAll(filepath.Join(*out, "sbom"), 0o755); err != nil {
		return err
	}
	var list []released
	for _, c := range images.Components() {
		r := released{Name: c.Name, Ref: c.Ref(*version), Archive: c.Name + ".oci.tar"}
		var imgs []*images.Image
		for _, arch := range arches {
			binPath := filepath.Join(dirs[arch], c.Binary)
			if _, err := os.Stat(binPath); err != nil {
				continue // not built for this architecture (the cgo agent: amd64 only)
			}
			spec, err := images.ProjectSpec(c, images.ProjectOptions{Version: *version, BinDir: dirs[arch], LibRoot: libRoot(arch),
				Created: created, Package: dpkgLookup(libRoot(arch))})
			if err != nil {
				return err
			}
			if spec.Architecture != arch {
				return fmt.Errorf("%s: %s is built for %s, not %s", c.Name, binPath, spec.Architecture, arch)
			}
			img, err := images.Build(spec)
			if err != nil {
				return err
			}
			imgs = append(imgs, img)
			platform := "linux/" + arch
			sbom, err := images.SBOM(r.Ref+" "+platform, spec, binPath, created)
			if err != nil {
				return err
			}
			name := filepath.Join("sbom", c.Name+"_linux_"+arch+".spdx.json")
			if err := writeFile(filepath.Join(*out, name), append(sbom, '\n')); err != nil {
				return err
			}
			r.Platforms, r.SBOMs = append(r.Platforms, platform), append(r.SBOMs, name)
		}
		if len(imgs) == 0 {
			return fmt.Errorf("%s: no binary %s in any of %v", c.Name, c.Binary, bins)
		}
		digest, err := images.WriteIndexArchive(filepath.Join(*out, r.Archive), imgs)
		if err != nil {
			return err
		}
		r.Digest = digest.String()
		fmt.Fprintf(stdout, "%s\t%s\t%s\t%s\n", r.Ref, filepath.Join(*out, r.Archive), r.Digest, strings.Join(r.Platforms, ","))
		list = append(list, r)
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(*out, "images.json"), append(data, '\n'))
}
