package images

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
)

// FilesFromDir lists the tree below dir as image files rooted at /: directories,
// regular files (copied at build time) and symlinks (their targets kept as
// written), with their permissions (setuid, setgid, sticky included). Owners are
// not kept: every file is root's, so the image does not depend on who prepared the
// tree. Anything else (devices, sockets, FIFOs) is refused with ErrInvalidSpec.
func FilesFromDir(dir string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		f := File{Path: path.Join("/", filepath.ToSlash(rel)), Mode: info.Mode()}
		switch info.Mode().Type() {
		case fs.ModeDir:
		case fs.ModeSymlink:
			if f.Link, err = os.Readlink(p); err != nil {
				return err
			}
		case 0:
			f.Source = p
		default:
			return fmt.Errorf("%w: %s: unsupported file type %s", ErrInvalidSpec, p, info.Mode().Type())
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("files of %s: %w", dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrInvalidSpec, dir)
	}
	return files, nil
}
