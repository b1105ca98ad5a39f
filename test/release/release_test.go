// Package release_test runs `make release`'s script into a temporary directory and
// checks what a user installs from: the files and their checksums, install.yaml's
// images, the chart and its index, the multi-platform OCI archives and their SBOMs,
// the kubectl plugin's archives and krew manifest.
package release_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/images"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
)

const repo = "../.."

// release runs scripts/release.sh for registry into a temporary DIST and returns it.
func release(t *testing.T, registry string) string {
	t.Helper()
	shim, err := filepath.Abs(filepath.Join(repo, "bin", "libunderstory-tsg.so"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shim); err != nil {
		testenv.SkipOrFailInCI(t, "%s not built: run `make tsg-shim` (make test does)", shim)
	}
	bin := t.TempDir()
	data, err := os.ReadFile(shim)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "libunderstory-tsg.so"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	dist := filepath.Join(t.TempDir(), "dist")
	cmd := exec.Command("scripts/release.sh")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "DIST="+dist, "BIN="+bin, "REGISTRY="+registry,
		"HELM="+controlplane.HelmBinary(t, repo), "KUBECTL="+controlplane.FindKubectl(t),
		"RELEASE_URL=https://downloads.example/v0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, out)
	}
	// The images and the summary; not the C compiler's warnings of the cgo build.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "understory/") || strings.HasPrefix(line, "release ") {
			t.Log(line)
		}
	}
	return dist
}

// TestRelease is the whole release, once (it builds every binary for two
// architectures), checked part by part, then pushed to a registry (`make push`).
func TestRelease(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	registry := strings.TrimPrefix(srv.URL, "http://") + "/u"
	dist := release(t, registry)
	version, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	tagRE := regexp.MustCompile(`^` + regexp.QuoteMeta(strings.TrimSpace(string(version))) + `(-g[0-9a-f]{12}(-dirty)?)?$`)
	var tag string

	t.Run("checksums", func(t *testing.T) {
		sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
			sum, name, ok := strings.Cut(line, "  ")
			if !ok {
				t.Fatalf("SHA256SUMS line %q", line)
			}
			data, err := os.ReadFile(filepath.Join(dist, name))
			if err != nil {
				t.Fatal(err)
			}
			if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != sum {
				t.Errorf("%s: checksum differs", name)
			}
			listed[name] = true
		}
		if err := filepath.WalkDir(dist, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(dist, p)
			if rel != "SHA256SUMS" && !listed[rel] {
				t.Errorf("%s is not in SHA256SUMS", rel)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("images", func(t *testing.T) {
		var list []struct {
			Name, Ref, Archive, Digest string
			Platforms, SBOMs           []string
		}
		readJSON(t, filepath.Join(dist, "images", "images.json"), &list)
		if len(list) != 5 {
			t.Fatalf("%d images, want 5", len(list))
		}
		for _, im := range list {
			_, tg, _ := strings.Cut(im.Ref, ":")
			if tag == "" {
				tag = tg
			}
			if !tagRE.MatchString(tg) || tg != tag {
				t.Errorf("%s: tag %q, want VERSION or VERSION-g<commit>, the same for all", im.Name, tg)
			}
			want := []string{"linux/amd64", "linux/arm64"} // the cgo agent's arm64 by a cross compiler
			if strings.Join(im.Platforms, ",") != strings.Join(want, ",") {
				t.Errorf("%s: platforms %v, want %v", im.Name, im.Platforms, want)
			}
			checkArchive(t, filepath.Join(dist, "images", im.Archive), im.Ref, im.Digest, want)
			for _, s := range im.SBOMs {
				var doc struct {
					SPDXVersion string `json:"spdxVersion"`
					Packages    []struct {
						Name string `json:"name"`
					} `json:"packages"`
				}
				readJSON(t, filepath.Join(dist, "images", s), &doc)
				names := map[string]bool{}
				for _, p := range doc.Packages {
					names[p.Name] = true
				}
				// The cgo agent's image copies glibc from this Debian machine, with its
				// dpkg status: its SBOM names the package.
				if _, err := exec.LookPath("dpkg-query"); err == nil && im.Name == "koordlet" && !names["libc6"] {
					t.Errorf("%s: no libc6 package for the glibc the image carries", s)
				}
				if doc.SPDXVersion != "SPDX-2.3" || !names["github.com/understory/understory"] || !names["stdlib"] ||
					!names["k8s.io/client-go"] {
					t.Errorf("%s: %s with %d packages: want SPDX-2.3 naming the module, stdlib and client-go", s,
						doc.SPDXVersion, len(doc.Packages))
				}
			}
		}
	})
	if tag == "" {
		t.Fatal("no tag: the images part failed")
	}

	t.Run("install.yaml", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(dist, "install.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		images := regexp.MustCompile(`(?m)^\s+(?:- )?image: (\S+)$`).FindAllStringSubmatch(string(data), -1)
		if len(images) < 3 {
			t.Fatalf("%d images in install.yaml", len(images))
		}
		for _, m := range images {
			if !strings.HasPrefix(m[1], registry+"/") || !strings.HasSuffix(m[1], ":"+tag) {
				t.Errorf("install.yaml names %s, want %s/<name>:%s", m[1], registry, tag)
			}
		}
		if !strings.Contains(string(data), "kind: Certificate") || strings.Contains(string(data), "tls.key:") {
			t.Error("install.yaml must take its certificates from cert-manager and carry no private key")
		}
	})

	t.Run("chart", func(t *testing.T) {
		var index struct {
			Entries map[string][]struct {
				Version string   `json:"version"`
				URLs    []string `json:"urls"`
			} `json:"entries"`
		}
		data, err := os.ReadFile(filepath.Join(dist, "index.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &index); err != nil {
			t.Fatal(err)
		}
		e := index.Entries["understory"]
		pkg := "understory-" + tag + ".tgz"
		if len(e) != 1 || e[0].Version != tag || len(e[0].URLs) != 1 || e[0].URLs[0] != "https://downloads.example/v0/"+pkg {
			t.Fatalf("index.yaml entries %+v, want understory %s at the release URL", e, tag)
		}
		out, err := exec.Command(controlplane.HelmBinary(t, repo), "template", "understory", filepath.Join(dist, pkg),
			"-n", "understory-system", "--kube-version", "v1.37.2").CombinedOutput()
		if err != nil {
			t.Fatalf("helm template of the packaged chart: %v\n%s", err, out)
		}
		if want := "image: \"" + registry + "/scheduler-extender:" + tag + "\""; !strings.Contains(string(out), want) {
			t.Errorf("the packaged chart does not default to the release's images: no %s", want)
		}
	})

	t.Run("push", func(t *testing.T) {
		cmd := exec.Command("scripts/push.sh")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "DIST="+dist, "BIN="+t.TempDir(), "REGISTRY="+registry, "INSECURE=1",
			"HELM="+controlplane.HelmBinary(t, repo), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_CACHE_HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("scripts/push.sh: %v\n%s", err, out)
		}
		var list []struct{ Name, Digest string }
		readJSON(t, filepath.Join(dist, "images", "images.json"), &list)
		for _, im := range list {
			ref, err := name.NewTag(registry+"/"+im.Name+":"+tag, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			idx, err := remote.Index(ref)
			if err != nil {
				t.Fatalf("%s: %v", ref, err)
			}
			if d, _ := idx.Digest(); d.String() != im.Digest {
				t.Errorf("%s: the registry serves %s, the release has %s", ref, d, im.Digest)
			}
		}
		pulled := t.TempDir()
		if out, err := exec.Command(controlplane.HelmBinary(t, repo), "pull", "oci://"+registry+"/charts/understory",
			"--version", tag, "--plain-http", "-d", pulled).CombinedOutput(); err != nil {
			t.Fatalf("helm pull of the pushed chart: %v\n%s", err, out)
		}
		// Released for one registry, pushed to another: refused before anything moves.
		cmd = exec.Command("scripts/push.sh")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "DIST="+dist, "REGISTRY=elsewhere.example/u", "HELM="+controlplane.HelmBinary(t, repo))
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "another registry") {
			t.Errorf("push to another registry than the release's: %v\n%s", err, out)
		}
	})

	t.Run("kubectl plugin", func(t *testing.T) {
		var plugin struct {
			Spec struct {
				Version   string `json:"version"`
				Platforms []struct {
					Selector struct {
						MatchLabels map[string]string `json:"matchLabels"`
					} `json:"selector"`
					URI    string `json:"uri"`
					SHA256 string `json:"sha256"`
					Bin    string `json:"bin"`
				} `json:"platforms"`
			} `json:"spec"`
		}
		data, err := os.ReadFile(filepath.Join(dist, "krew", "understory.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &plugin); err != nil {
			t.Fatal(err)
		}
		if plugin.Spec.Version != "v"+tag || len(plugin.Spec.Platforms) != 2 {
			t.Fatalf("krew manifest %+v", plugin.Spec)
		}
		machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
		for _, p := range plugin.Spec.Platforms {
			arch := p.Selector.MatchLabels["arch"]
			archive := filepath.Join(dist, filepath.Base(p.URI))
			data, err := os.ReadFile(archive)
			if err != nil {
				t.Fatal(err)
			}
			if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != p.SHA256 {
				t.Errorf("%s: krew's sha256 differs from the archive's", archive)
			}
			bin := untarFile(t, data, p.Bin)
			f, err := elf.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatalf("%s: %v", archive, err)
			}
			if f.Machine != machines[arch] {
				t.Errorf("%s: built for %v, want %s", archive, f.Machine, arch)
			}
		}
	})
}

// checkArchive opens an OCI archive and checks its one image index: the tag, the
// digest and one image per platform, each of that platform.
func checkArchive(t *testing.T, path, ref, digest string, platforms []string) {
	t.Helper()
	idx, gotRef, err := images.ReadIndexArchive(path, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); gotRef != ref || d.String() != digest {
		t.Errorf("%s: ref %q digest %s, want %s %s", path, gotRef, d, ref, digest)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range m.Manifests {
		img, err := idx.Image(e.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		p := e.Platform.OS + "/" + e.Platform.Architecture
		if cf.OS+"/"+cf.Architecture != p {
			t.Errorf("%s: the %s entry's image is %s/%s", path, p, cf.OS, cf.Architecture)
		}
		got = append(got, p)
	}
	if strings.Join(got, ",") != strings.Join(platforms, ",") {
		t.Errorf("%s: platforms %v, want %v", path, got, platforms)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// untarFile returns file name of a .tar.gz.
func untarFile(t *testing.T, tgz []byte, name string) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in the archive: %v", name, err)
		}
		if h.Name == name {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
}

// The release workflow (for the day the project has a public home) does what the
// README says a release is: on a v* tag equal to VERSION, make release and make push
// to ghcr.io, cosign the pushed images, and publish dist/ as the GitHub release.
func TestReleaseWorkflow(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(repo, ".github", "workflows", "release.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// YAML 1.1 reads the key "on" as true: take it under either name.
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	on, _ := raw["on"].(map[string]any)
	if on == nil {
		on, _ = raw["true"].(map[string]any)
	}
	push, _ := on["push"].(map[string]any)
	if tags, _ := push["tags"].([]any); len(tags) != 1 || tags[0] != "v*" {
		t.Errorf("triggered by tags %v, want v*", push["tags"])
	}
	var wf struct {
		Jobs map[string]struct {
			Env   map[string]string `json:"env"`
			Steps []struct {
				Uses string `json:"uses"`
				Run  string `json:"run"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	if err := yaml.Unmarshal(data, &wf); err != nil {
		t.Fatal(err)
	}
	job, ok := wf.Jobs["release"]
	if !ok {
		t.Fatal("no release job")
	}
	var runs []string
	for _, s := range job.Steps {
		runs = append(runs, s.Run)
	}
	all := strings.Join(runs, "\n")
	for _, want := range []string{`"v$(cat VERSION)"`, "make release", "make push", "cosign sign", "gh release create", "dist/SHA256SUMS"} {
		if !strings.Contains(all, want) {
			t.Errorf("the workflow does not run %q", want)
		}
	}
	if !strings.HasPrefix(job.Env["REGISTRY"], "ghcr.io/") {
		t.Errorf("REGISTRY %q, want ghcr.io", job.Env["REGISTRY"])
	}
}
