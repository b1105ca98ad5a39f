package manifestcopy

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// writeTree writes files (path → content; a path ending in .sh is executable, one
// ending in .key mode 0600) below root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for path, content := range files {
		mode := fs.FileMode(0o644)
		switch filepath.Ext(path) {
		case ".sh":
			mode = 0o755
		case ".key":
			mode = 0o600
		}
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCopy sets PATH (a fake openssl, or none), so its cases cannot run in parallel.
func TestCopy(t *testing.T) {
	// generate.sh marks the directory it ran in with shell builtins only: PATH is a
	// fake here.
	const generate = "#!/bin/sh\necho generated > \"${0%/*}/made\"\n"
	tree := map[string]string{
		"kustomization.yaml":                   "resources: [base]\n",
		"base/agent.yaml":                      "kind: DaemonSet\n",
		"overlays/realnode/kustomization.yaml": "images: []\n",
		"certs/kustomization.yaml":             "kind: Component\n",
		"certs/generate.sh":                    generate,
		"certs/secret.key":                     "not generated\n",
		"certs/generated/ca.key":               "a user's CA key\n",
	}
	withOpenSSL := t.TempDir() // a PATH with an openssl: Copy only looks it up
	if err := os.WriteFile(filepath.Join(withOpenSSL, "openssl"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		path    string            // PATH
		src     map[string]string // nil: src does not exist
		wantErr func(error) bool  // nil: no error
	}{
		{name: "copies without certs/generated", path: withOpenSSL, src: tree},
		{name: "generate.sh fails", path: withOpenSSL,
			src: map[string]string{"certs/generate.sh": "#!/bin/sh\necho no CA >&2\nexit 3\n"},
			wantErr: func(err error) bool {
				var exit *exec.ExitError
				return errors.As(err, &exit) && exit.ExitCode() == 3 && !errors.Is(err, ErrNoOpenSSL)
			}},
		{name: "no openssl", path: t.TempDir(), src: tree,
			wantErr: func(err error) bool { return errors.Is(err, ErrNoOpenSSL) }},
		{name: "no source", path: withOpenSSL,
			wantErr: func(err error) bool { return errors.Is(err, fs.ErrNotExist) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", tc.path)
			src := filepath.Join(t.TempDir(), "manifests")
			if tc.src != nil {
				writeTree(t, src, tc.src)
			}
			dst := filepath.Join(t.TempDir(), "manifests")
			err := Copy(src, dst)
			if tc.wantErr != nil {
				if err == nil || !tc.wantErr(err) {
					t.Fatalf("Copy: %v, want the case's error", err)
				}
				if errors.Is(err, ErrNoOpenSSL) {
					if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("without openssl %s was written (%v)", dst, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Copy: %v", err)
			}
			for path, content := range tc.src {
				got, err := os.ReadFile(filepath.Join(dst, path))
				if filepath.Dir(path) == filepath.Join("certs", "generated") {
					if !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s copied (%v): certs/generated must be left out", path, err)
					}
					continue
				}
				if err != nil || string(got) != content {
					t.Errorf("%s: %q, %v; want %q", path, got, err, content)
				}
				want, err := os.Stat(filepath.Join(src, path))
				if err != nil {
					t.Fatal(err)
				}
				if cp, err := os.Stat(filepath.Join(dst, path)); err != nil || cp.Mode() != want.Mode() {
					t.Errorf("%s: %v, want mode %v", path, describe(cp, err), want.Mode())
				}
			}
			if _, err := os.Stat(filepath.Join(dst, "certs", "made")); err != nil {
				t.Errorf("generate.sh did not run in the copy: %v", err)
			}
			if _, err := os.Stat(filepath.Join(src, "certs", "made")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("generate.sh ran in the source (%v)", err)
			}
		})
	}
}

func describe(fi fs.FileInfo, err error) string {
	if err != nil {
		return err.Error()
	}
	return "mode " + fi.Mode().String()
}
