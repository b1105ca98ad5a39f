package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// Permission bits of a tar header beyond fs.ModePerm.
const (
	tarSetuid = 0o4000
	tarSetgid = 0o2000
	tarSticky = 0o1000
)

// layerTar returns the uncompressed tar of files: sorted by path, every parent
// directory present (0755, root's, unless listed), every mtime mtime, owners numeric.
func layerTar(files []File, mtime time.Time) ([]byte, error) {
	byPath := make(map[string]File, len(files))
	for _, f := range files {
		if err := checkFile(f); err != nil {
			return nil, err
		}
		if _, dup := byPath[f.Path]; dup {
			return nil, fmt.Errorf("%w: %s listed twice", ErrInvalidSpec, f.Path)
		}
		byPath[f.Path] = f
	}
	for _, f := range files {
		for dir := path.Dir(f.Path); dir != "/"; dir = path.Dir(dir) {
			d, ok := byPath[dir]
			if !ok {
				byPath[dir] = File{Path: dir, Mode: fs.ModeDir | 0o755}
				continue
			}
			if !d.Mode.IsDir() {
				return nil, fmt.Errorf("%w: %s is below %s, which is not a directory", ErrInvalidSpec, f.Path, dir)
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	// A parent is a prefix of its children, so it sorts before them.
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		if err := writeEntry(tw, byPath[p], mtime); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer tar: %w", err)
	}
	return buf.Bytes(), nil
}

// checkFile validates one entry on its own.
func checkFile(f File) error {
	if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" || strings.ContainsRune(f.Path, 0) {
		return fmt.Errorf("%w: path %q must be absolute, clean, not / and without NUL", ErrInvalidSpec, f.Path)
	}
	if strings.ContainsRune(f.Link, 0) {
		return fmt.Errorf("%w: %s: link target %q has a NUL", ErrInvalidSpec, f.Path, f.Link)
	}
	if f.UID < 0 || f.GID < 0 {
		return fmt.Errorf("%w: %s: negative owner %d:%d", ErrInvalidSpec, f.Path, f.UID, f.GID)
	}
	switch f.Mode.Type() {
	case fs.ModeDir:
		if f.Source != "" || f.Data != nil || f.Link != "" {
			return fmt.Errorf("%w: directory %s has content", ErrInvalidSpec, f.Path)
		}
	case fs.ModeSymlink:
		if f.Link == "" || f.Source != "" || f.Data != nil {
			return fmt.Errorf("%w: symlink %s needs a target and nothing else", ErrInvalidSpec, f.Path)
		}
	case 0:
		if f.Link != "" || (f.Source != "") == (f.Data != nil) {
			return fmt.Errorf("%w: regular file %s needs exactly one of Source and Data", ErrInvalidSpec, f.Path)
		}
	default:
		return fmt.Errorf("%w: %s: unsupported file type %s", ErrInvalidSpec, f.Path, f.Mode.Type())
	}
	return nil
}

// writeEntry writes one header and, for a regular file, its content.
func writeEntry(tw *tar.Writer, f File, mtime time.Time) error {
	h := &tar.Header{
		Name:    strings.TrimPrefix(f.Path, "/"),
		Mode:    tarMode(f.Mode),
		Uid:     f.UID,
		Gid:     f.GID,
		ModTime: mtime,
		Format:  tar.FormatPAX,
	}
	var content io.Reader
	switch f.Mode.Type() {
	case fs.ModeDir:
		h.Typeflag = tar.TypeDir
		h.Name += "/"
	case fs.ModeSymlink:
		h.Typeflag = tar.TypeSymlink
		h.Linkname = f.Link
	default:
		h.Typeflag = tar.TypeReg
		if f.Source == "" {
			h.Size = int64(len(f.Data))
			content = bytes.NewReader(f.Data)
			break
		}
		src, err := os.Open(f.Source)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		defer src.Close()
		st, err := src.Stat()
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%w: %s: source %s is not a regular file", ErrInvalidSpec, f.Path, f.Source)
		}
		h.Size = st.Size()
		content = src
	}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	if content != nil {
		// A source that grows or shrinks while read fails here (tar checks the size).
		if n, err := io.Copy(tw, content); err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		} else if n != h.Size {
			return fmt.Errorf("%s: read %d bytes of %d", f.Path, n, h.Size)
		}
	}
	return nil
}

// tarMode is the tar header mode of m: permissions plus setuid, setgid, sticky.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= tarSetuid
	}
	if m&fs.ModeSetgid != 0 {
		mode |= tarSetgid
	}
	if m&fs.ModeSticky != 0 {
		mode |= tarSticky
	}
	return mode
}
