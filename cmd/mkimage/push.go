package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/understory/understory/images"
)

// push sends a release's images (mkimage release's images.json and archives) to a
// registry as REGISTRY/<name>:<tag>, each as its multi-platform index.
func push(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkimage push", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registry := fs.String("registry", "", "where the images go: HOST[:PORT][/PATH]; required")
	dir := fs.String("images", "dist/images", "the release's images (images.json and the archives)")
	insecure := fs.Bool("insecure", false, "plain HTTP (a local test registry)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *registry == "" || fs.NArg() != 0 {
		return fmt.Errorf("%w: mkimage push -registry HOST[/PATH] [-images DIR] [-insecure]", errUsage)
	}
	var list []released
	data, err := os.ReadFile(filepath.Join(*dir, "images.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(*dir, "images.json"), err)
	}
	var opts []name.Option
	if *insecure {
		opts = append(opts, name.Insecure)
	}
	for _, r := range list {
		tmp, err := os.MkdirTemp("", "mkimage-push-")
		if err != nil {
			return err
		}
		err = pushOne(r, *dir, tmp, strings.TrimSuffix(*registry, "/"), opts, stdout)
		os.RemoveAll(tmp)
		if err != nil {
			return err
		}
	}
	return nil
}

func pushOne(r released, dir, tmp, registry string, opts []name.Option, stdout io.Writer) error {
	idx, ref, err := images.ReadIndexArchive(filepath.Join(dir, r.Archive), tmp)
	if err != nil {
		return err
	}
	_, tag, ok := strings.Cut(ref, ":")
	if !ok || ref != r.Ref {
		return fmt.Errorf("%s: the archive names %q, images.json %q", r.Archive, ref, r.Ref)
	}
	dst, err := name.NewTag(registry+"/"+r.Name+":"+tag, opts...)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := remote.WriteIndex(dst, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("pushing %s: %w", dst, err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s@%s\n", dst, digest)
	return nil
}
