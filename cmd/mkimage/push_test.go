package main

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/understory/understory/images"
)

// A release's images, pushed to a registry, are there as REGISTRY/<name>:<tag>: the
// same index digest, one image per platform.
func TestPush(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	out := t.TempDir()
	var imgs []*images.Image
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := images.Build(images.Spec{Ref: "understory/admission:v9", OS: "linux", Architecture: arch,
			Layers: []images.Layer{{Name: "x", Files: []images.File{{Path: "/admission", Mode: 0o755, Data: []byte(arch)}}}}})
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	digest, err := images.WriteIndexArchive(filepath.Join(out, "admission.oci.tar"), imgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "images.json"), []byte(`[{"name":"admission","ref":"understory/admission:v9",
		"archive":"admission.oci.tar","digest":"`+digest.String()+`","platforms":["linux/amd64","linux/arm64"]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	if err := run([]string{"push", "-registry", host + "/team", "-images", out, "-insecure"}, &stdout, io.Discard, ""); err != nil {
		t.Fatal(err)
	}
	want := host + "/team/admission:v9@" + digest.String()
	if strings.TrimSpace(stdout.String()) != want {
		t.Errorf("printed %q, want %q", stdout.String(), want)
	}
	ref, err := name.NewTag(host+"/team/admission:v9", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d != digest {
		t.Errorf("the registry serves %s, want %s", d, digest)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 2 {
		t.Fatalf("index %+v (%v), want two platforms", m, err)
	}
	// A registry that refuses (here: none listening) fails the push with its address.
	if err := run([]string{"push", "-registry", "127.0.0.1:1", "-images", out, "-insecure"}, io.Discard, io.Discard, ""); err == nil ||
		!strings.Contains(err.Error(), "127.0.0.1:1/admission:v9") {
		t.Errorf("push to nowhere: %v", err)
	}
}
