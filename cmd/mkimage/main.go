// Command mkimage builds Understory's OCI images without a Docker engine or a
// registry (package images, on go-containerregistry), as `docker save`-style
// tarballs for `ctr images import`, `docker load`, `kind load image-archive` or
// `crane push`.
//
//	mkimage project -version V [-bin bin] [-out bin/images] [-lib-root /]
//	    one image per deployed binary: OUT/<name>.tar tagged understory/<name>:V,
//	    and OUT/images.json listing them (`make images`)
//	mkimage dir -ref NAME:TAG -rootfs DIR -out FILE.tar [-entrypoint ARG]... [-cmd ARG]...
//	    [-env K=V]... [-user U] [-workdir D] [-label K=V]... [-arch GOARCH]
//	    one image of one layer: the tree below DIR, owned by root
//	    (scripts/realnode/build.sh: the pause and busybox images)
//	mkimage release -version V -bin ARCH=DIR [-bin ARCH=DIR]... [-out dist/images] [-lib-root [ARCH=]DIR]...
//	    the release's images: for each component, one image per architecture whose
//	    DIR holds its binary, as one multi-platform OCI archive OUT/<name>.oci.tar
//	    (an image index in an OCI layout, tagged understory/<name>:V), an SPDX SBOM
//	    per image in OUT/sbom/<name>_linux_<arch>.spdx.json, and OUT/images.json
//	    (`make release`)
//	mkimage push -registry HOST[/PATH] [-images dist/images] [-insecure]
//	    pushes a release's images (images.json) to HOST[/PATH]/<name>:<tag>, each as its
//	    multi-platform index, with the credentials of ~/.docker/config.json (`make push`)
//	mkimage binary -ref NAME:TAG -bin FILE -entrypoint /PATH -out FILE.tar [-user U]
//	    [-lib-root /] [-label K=V]...
//	    one prebuilt binary at /PATH, also the entrypoint, over the project images'
//	    base layer (with its loader and libraries when it is dynamically linked),
//	    e.g. registry.k8s.io/kube-scheduler:v1.37.2 from the cached kube-scheduler
//	    for the real node, which has no network (the second scheduler)
//
// SOURCE_DATE_EPOCH (seconds) sets the images' time, default the Unix epoch, so
// the same inputs give the same bytes.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/images"
)

// errUsage means the command line is wrong; main exits 2.
var errUsage = errors.New("usage")

// listFlag is a flag that may be repeated; each use appends one value.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, " ") }

func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

var _ flag.Value = (*listFlag)(nil)

// built is one line of images.json.
type built struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
	// Tar is the tarball's path relative to images.json.
	Tar string `json:"tar"`
	// ID is the config digest: what `ctr images ls` and `docker images` show.
	ID         string   `json:"id"`
	User       string   `json:"user"`
	Entrypoint []string `json:"entrypoint"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv("SOURCE_DATE_EPOCH")); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer, epoch string) error {
	created := time.Unix(0, 0).UTC()
	if epoch != "" {
		s, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil || s < 0 {
			return fmt.Errorf("%w: SOURCE_DATE_EPOCH=%q is not a number of seconds", errUsage, epoch)
		}
		created = time.Unix(s, 0).UTC()
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: mkimage project|dir|binary [flags] (-h for each)", errUsage)
	}
	switch args[0] {
	case "project":
		return project(args[1:], stdout, stderr, created)
	case "dir":
		return dir(args[1:], stdout, stderr, created)
	case "binary":
		return binary(args[1:], stdout, stderr, created)
	case "release":
		return release(args[1:], stdout, stderr, created)
	case "push":
		return push(args[1:], stdout, stderr)
	}
	return fmt.Errorf("%w: unknown subcommand %q, want project, release, push, dir or binary", errUsage, args[0])
}

func project(args []string, stdout, stderr io.Writer, created time.Time) error {
	fs := flag.NewFlagSet("mkimage project", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "image tag, e.g. the repository's VERSION file (the Makefile passes it); required")
	binDir := fs.String("bin", "bin", "directory of the built binaries (make build)")
	out := fs.String("out", "bin/images", "directory for <name>.tar and images.json")
	libRoot := fs.String("lib-root", "/", "where a cgo binary's loader and libraries are copied from")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *version == "" || fs.NArg() != 0 {
		return fmt.Errorf("%w: mkimage project -version V [-bin DIR] [-out DIR] [-lib-root DIR]", errUsage)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	o := images.ProjectOptions{Version: *version, BinDir: *binDir, LibRoot: *libRoot, Created: created,
		Package: dpkgLookup(*libRoot)}
	var list []built
	for _, c := range images.Components() {
		spec, err := images.ProjectSpec(c, o)
		if err != nil {
			return err
		}
		b, err := write(spec, filepath.Join(*out, c.Name+".tar"), stdout)
		if err != nil {
			return err
		}
		b.Name, b.Tar = c.Name, c.Name+".tar"
		list = append(list, b)
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(*out, "images.json"), append(data, '\n'))
}

func dir(args []string, stdout, stderr io.Writer, created time.Time) error {
	fs := flag.NewFlagSet("mkimage dir", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var entrypoint, cmd, env, labels listFlag
	ref := fs.String("ref", "", "image name with its tag, e.g. understory.local/pause:realnode; required")
	rootfs := fs.String("rootfs", "", "directory whose tree is the image's one layer; required")
	out := fs.String("out", "", "tarball to write; required")
	user := fs.String("user", "", "user the container runs as (numeric uid[:gid] lets kubelet check runAsNonRoot)")
	workdir := fs.String("workdir", "/", "working directory")
	arch := fs.String("arch", runtime.GOARCH, "image architecture (GOARCH spelling)")
	fs.Var(&entrypoint, "entrypoint", "entrypoint argument (repeat for each)")
	fs.Var(&cmd, "cmd", "cmd argument (repeat for each)")
	fs.Var(&env, "env", "environment variable K=V (repeat for each)")
	fs.Var(&labels, "label", "config label K=V (repeat for each)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *ref == "" || *rootfs == "" || *out == "" || fs.NArg() != 0 {
		return fmt.Errorf("%w: mkimage dir -ref NAME:TAG -rootfs DIR -out FILE.tar [flags]", errUsage)
	}
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("%w: -env %q is not K=V", errUsage, e)
		}
	}
	lm, err := parseLabels(labels)
	if err != nil {
		return err
	}
	files, err := images.FilesFromDir(*rootfs)
	if err != nil {
		return err
	}
	spec := images.Spec{
		Ref: *ref, OS: "linux", Architecture: *arch,
		Layers:     []images.Layer{{Name: "rootfs", Files: files}},
		Entrypoint: entrypoint, Cmd: cmd, Env: env, User: *user, WorkingDir: *workdir,
		Created: created,
	}
	if len(lm) > 0 {
		spec.Labels = lm
	}
	_, err = write(spec, *out, stdout)
	return err
}

func binary(args []string, stdout, stderr io.Writer, created time.Time) error {
	fs := flag.NewFlagSet("mkimage binary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var labels listFlag
	ref := fs.String("ref", "", "image name with its tag, e.g. registry.k8s.io/kube-scheduler:v1.37.2; required")
	bin := fs.String("bin", "", "the binary to copy into the image; required")
	entrypoint := fs.String("entrypoint", "", "absolute path of the binary in the image, also the entrypoint, "+
		"e.g. /usr/local/bin/kube-scheduler; required")
	out := fs.String("out", "", "tarball to write; required")
	user := fs.String("user", images.NonRootUser, "user the container runs as (numeric uid[:gid])")
	libRoot := fs.String("lib-root", "/", "where a dynamically linked binary's loader and libraries are copied from")
	fs.Var(&labels, "label", "config label K=V (repeat for each)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *ref == "" || *bin == "" || *entrypoint == "" || *out == "" || fs.NArg() != 0 {
		return fmt.Errorf("%w: mkimage binary -ref NAME:TAG -bin FILE -entrypoint /PATH -out FILE.tar [flags]", errUsage)
	}
	lm, err := parseLabels(labels)
	if err != nil {
		return err
	}
	spec, err := images.BinarySpec(images.BinaryOptions{
		Ref: *ref, Binary: *bin, Entrypoint: *entrypoint, User: *user, LibRoot: *libRoot, Labels: lm, Created: created,
	})
	if err != nil {
		return err
	}
	_, err = write(spec, *out, stdout)
	return err
}

// parseLabels turns -label K=V flags into a map.
func parseLabels(labels []string) (map[string]string, error) {
	lm := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: -label %q is not K=V", errUsage, l)
		}
		lm[k] = v
	}
	return lm, nil
}

// write builds spec, writes it to path and prints one line about it.
func write(spec images.Spec, path string, stdout io.Writer) (built, error) {
	img, err := images.Build(spec)
	if err != nil {
		return built{}, err
	}
	id, err := img.Image.ConfigName()
	if err != nil {
		return built{}, fmt.Errorf("%s: %w", spec.Ref, err)
	}
	if err := images.WriteTarball(path, img); err != nil {
		return built{}, err
	}
	fmt.Fprintf(stdout, "%s\t%s\t%s\n", spec.Ref, path, id)
	return built{Ref: spec.Ref, ID: id.String(), User: spec.User, Entrypoint: spec.Entrypoint}, nil
}

// writeFile replaces path through a temporary file.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
