package manifestcopy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// ErrNoOpenSSL: openssl is not on PATH, so certs/generate.sh cannot run.
var ErrNoOpenSSL = errors.New("openssl not found")

// Copy copies the manifests tree src (the repository's manifests/) to dst, without
// certs/generated, and runs dst/certs/generate.sh to write the copy's certificates.
func Copy(src, dst string) error {
	if _, err := exec.LookPath("openssl"); err != nil {
		return fmt.Errorf("%w: manifests/certs/generate.sh needs it (Debian package openssl)", ErrNoOpenSSL)
	}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() && rel == filepath.Join("certs", "generated") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode().Perm())
	})
	if err != nil {
		return fmt.Errorf("copying manifests: %w", err)
	}
	if out, err := exec.Command(filepath.Join(dst, "certs", "generate.sh")).CombinedOutput(); err != nil {
		return fmt.Errorf("certs/generate.sh: %w\n%s", err, out)
	}
	return nil
}
