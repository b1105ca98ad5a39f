package images

import (
	"fmt"
	"path"
	"time"
)

// BinaryOptions describe an image of one prebuilt binary that is not the project's
// (an upstream kube-scheduler for a node without network, say).
type BinaryOptions struct {
	// Ref is the image reference with an explicit tag (never latest), e.g.
	// registry.k8s.io/kube-scheduler:v1.37.2.
	Ref string
	// Binary is the host file to copy.
	Binary string
	// Entrypoint is where the binary lands in the image, an absolute path, and the
	// image's entrypoint (e.g. /usr/local/bin/kube-scheduler, where upstream's
	// images keep it).
	Entrypoint string
	// User the container runs as by default (numeric uid:gid); "" is NonRootUser.
	User string
	// LibRoot is where a dynamically linked binary's loader and libraries are copied
	// from; "" is "/".
	LibRoot string
	// Labels are added to the image's config labels.
	Labels map[string]string
	// Created is the image's time (see Spec.Created).
	Created time.Time
}

// BinarySpec is the image of one binary: the base layer every project image has
// (/etc/passwd and /etc/group with root and nonroot, their homes, /tmp), for a
// dynamically linked binary a layer with its loader and libraries, and the binary
// at o.Entrypoint, which is also the entrypoint. A relative or root entrypoint is
// an error wrapping ErrInvalidSpec; the reference is checked by Build.
func BinarySpec(o BinaryOptions) (Spec, error) {
	if o.Entrypoint == "" || !path.IsAbs(o.Entrypoint) || path.Clean(o.Entrypoint) != o.Entrypoint || o.Entrypoint == "/" {
		return Spec{}, fmt.Errorf("%w: entrypoint %q must be a clean absolute path of a file", ErrInvalidSpec, o.Entrypoint)
	}
	bin, err := ReadBinary(o.Binary)
	if err != nil {
		return Spec{}, fmt.Errorf("image %s: %w", o.Ref, err)
	}
	libRoot, user := o.LibRoot, o.User
	if libRoot == "" {
		libRoot = "/"
	}
	if user == "" {
		user = NonRootUser
	}
	layers := []Layer{{Name: "base", Files: baseFiles()}}
	if !bin.Static() {
		libs, err := RuntimeFiles(libRoot, o.Binary)
		if err != nil {
			return Spec{}, fmt.Errorf("image %s: %w", o.Ref, err)
		}
		layers = append(layers, Layer{Name: "glibc", Files: libs})
	}
	// The layer's tar adds the parent directories (0755, root).
	files := []File{{Path: o.Entrypoint, Mode: 0o755, Source: o.Binary}}
	spec := Spec{
		Ref:          o.Ref,
		OS:           "linux",
		Architecture: bin.Arch,
		Layers:       append(layers, Layer{Name: path.Base(o.Entrypoint), Files: files}),
		Entrypoint:   []string{o.Entrypoint},
		User:         user,
		WorkingDir:   "/",
		Created:      o.Created,
	}
	if len(o.Labels) > 0 {
		spec.Labels = o.Labels
	}
	return spec, nil
}
