package images

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// annotationRefName names an image in an OCI layout's index.json (what `crane push`,
// `skopeo copy oci-archive:` and `ctr images import --index-name` read).
const annotationRefName = "org.opencontainers.image.ref.name"

// WriteIndexArchive writes one multi-platform image: an OCI image index of imgs (one
// per platform, all with the same tag) in an OCI image layout, as a tar at path
// (an "oci-archive"). It returns the index's digest, the identity a registry keeps.
func WriteIndexArchive(path string, imgs []*Image) (v1.Hash, error) {
	if len(imgs) == 0 {
		return v1.Hash{}, fmt.Errorf("%w: %s: no images", ErrInvalidSpec, path)
	}
	ref := imgs[0].Tag
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, img := range imgs {
		if img.Tag.String() != ref.String() {
			return v1.Hash{}, fmt.Errorf("%w: %s and %s in one index", ErrInvalidSpec, ref, img.Tag)
		}
		cf, err := img.Image.ConfigFile()
		if err != nil {
			return v1.Hash{}, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img.Image, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture}}})
	}
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".layout-*")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: ref.String()})); err != nil {
		return v1.Hash{}, fmt.Errorf("%s: %w", path, err)
	}
	if err := tarDir(dir, path); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}

// tarDir writes the regular files below dir into a tar at path, sorted, with fixed
// owners and times: the same layout gives the same bytes.
func tarDir(dir, path string) (err error) {
	var names []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, p)
			names = append(names, rel)
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(names)
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	tw := tar.NewWriter(tmp)
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(n), Mode: 0o644, Size: fi.Size(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			f.Close()
			return err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// ReadIndexArchive opens an archive WriteIndexArchive wrote: its image index and the
// reference it was tagged with. dir receives the layout (the index reads its blobs
// from there, so dir must outlive its use).
func ReadIndexArchive(path, dir string) (v1.ImageIndex, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		name := filepath.Clean(filepath.FromSlash(h.Name))
		if h.Typeflag != tar.TypeReg || filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, ".."+string(filepath.Separator)) {
			return nil, "", fmt.Errorf("%w: %s: entry %q is not a file of an OCI layout", ErrInvalidSpec, path, h.Name)
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, "", err
		}
		out, err := os.Create(p)
		if err != nil {
			return nil, "", err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, "", err
		}
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, "", fmt.Errorf("%w: %s: want one image index in the layout, found %d entries", ErrInvalidSpec, path, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	return idx, m.Manifests[0].Annotations[annotationRefName], nil
}
