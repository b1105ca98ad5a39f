package images

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Sentinel errors callers may branch on.
var (
	// ErrInvalidSpec: a Spec or one of its files is malformed (bad path, duplicate,
	// no content, no layers, bad platform).
	ErrInvalidSpec = errors.New("invalid image spec")
	// ErrInvalidRef: the reference does not parse or has no explicit tag.
	ErrInvalidRef = errors.New("invalid image reference")
	// ErrLatestTag: the reference is tagged "latest", which images never are.
	ErrLatestTag = errors.New("image tag must not be latest")
)

// File is one entry of a layer. Its type comes from Mode: fs.ModeDir is a
// directory, fs.ModeSymlink a symbolic link to Link, neither a regular file whose
// content is the host file Source (symlinks followed) or else Data.
type File struct {
	Path     string      // absolute path in the image, e.g. /etc/passwd
	Mode     fs.FileMode // type bits and permissions (setuid, setgid and sticky kept)
	Source   string      // regular file: the host file to copy
	Data     []byte      // regular file: its content when Source is empty (empty, not nil, for an empty file)
	Link     string      // symlink: its target
	UID, GID int
}

// Layer is one image layer: its files and a name for the image history.
type Layer struct {
	Name  string
	Files []File
}

// Spec is everything an image is made of.
type Spec struct {
	// Ref is the image's name with an explicit tag, e.g. understory/koordlet:v1.2.0.
	Ref string
	// OS and Architecture (GOOS/GOARCH spelling) of the image's platform.
	OS, Architecture string
	// Layers, the base first. Each needs at least one file.
	Layers []Layer
	// The container config: what runs, as whom, where.
	Entrypoint, Cmd, Env []string
	User, WorkingDir     string
	Labels               map[string]string
	// Created is the config's created time, every history entry's and every file's
	// mtime (truncated to seconds); zero is the Unix epoch. Fix it for reproducible
	// images.
	Created time.Time
}

// Image is a built image and the tag it is written under.
type Image struct {
	Tag   name.Tag
	Image v1.Image
}

// ParseRef parses an image reference that must carry an explicit tag other than
// "latest".
func ParseRef(ref string) (name.Tag, error) {
	tag, err := name.NewTag(ref, name.WeakValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("%w %q: %w", ErrInvalidRef, ref, err)
	}
	// name.NewTag defaults a missing tag to "latest": require it written out. The
	// last path element holds the tag (a registry host may carry a port).
	if !strings.Contains(ref[strings.LastIndex(ref, "/")+1:], ":") {
		return name.Tag{}, fmt.Errorf("%w %q: no tag (images are tagged with their version)", ErrInvalidRef, ref)
	}
	if tag.TagStr() == name.DefaultTag {
		return name.Tag{}, fmt.Errorf("%w: %q", ErrLatestTag, ref)
	}
	return tag, nil
}

// Build makes the image s describes.
func Build(s Spec) (*Image, error) {
	tag, err := ParseRef(s.Ref)
	if err != nil {
		return nil, err
	}
	if s.OS == "" || s.Architecture == "" {
		return nil, fmt.Errorf("%w: %s: OS and architecture are required", ErrInvalidSpec, s.Ref)
	}
	if len(s.Layers) == 0 {
		return nil, fmt.Errorf("%w: %s: no layers", ErrInvalidSpec, s.Ref)
	}
	created := s.Created.UTC().Truncate(time.Second)
	if s.Created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	adds := make([]mutate.Addendum, 0, len(s.Layers))
	for i, l := range s.Layers {
		if len(l.Files) == 0 {
			return nil, fmt.Errorf("%w: %s: layer %d (%s) has no files", ErrInvalidSpec, s.Ref, i, l.Name)
		}
		data, err := layerTar(l.Files, created)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %d (%s): %w", s.Ref, i, l.Name, err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %d (%s): %w", s.Ref, i, l.Name, err)
		}
		adds = append(adds, mutate.Addendum{Layer: layer, History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "understory mkimage: " + l.Name,
			Comment:   l.Name,
		}})
	}
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Ref, err)
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: created}
	cf.OS = s.OS
	cf.Architecture = s.Architecture
	cf.Config = v1.Config{
		Entrypoint: s.Entrypoint,
		Cmd:        s.Cmd,
		Env:        s.Env,
		User:       s.User,
		WorkingDir: s.WorkingDir,
		Labels:     s.Labels,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Ref, err)
	}
	return &Image{Tag: tag, Image: img}, nil
}

// WriteTarball writes img as a `docker save`-style tarball at path, through a
// temporary file in the same directory, so path is either the old file or the
// complete new one.
func WriteTarball(path string, img *Image) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err := tarball.Write(img.Tag, img.Image, tmp); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
