package images

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// SBOM is the SPDX 2.3 document (JSON) of an image's software: the Go binary's main
// module, every module linked into it and the Go standard library, from the build
// information the Go linker writes into the binary (what `go version -m` prints),
// and the files of the image's other layers (a cgo binary's loader and libraries,
// extra files) by path. name is the image (reference and platform); created is the
// document's time (the image's, for reproducible output).
func SBOM(name string, spec Spec, binPath string, created time.Time) ([]byte, error) {
	info, err := buildinfo.ReadFile(binPath)
	if err != nil {
		return nil, fmt.Errorf("sbom %s: reading the Go build information of %s: %w", name, binPath, err)
	}
	type extRef struct {
		Category string `json:"referenceCategory"`
		Type     string `json:"referenceType"`
		Locator  string `json:"referenceLocator"`
	}
	type checksum struct {
		Algorithm string `json:"algorithm"`
		Value     string `json:"checksumValue"`
	}
	type pkg struct {
		Name             string     `json:"name"`
		SPDXID           string     `json:"SPDXID"`
		Version          string     `json:"versionInfo,omitempty"`
		DownloadLocation string     `json:"downloadLocation"`
		FilesAnalyzed    bool       `json:"filesAnalyzed"`
		Checksums        []checksum `json:"checksums,omitempty"`
		ExternalRefs     []extRef   `json:"externalRefs,omitempty"`
		Comment          string     `json:"comment,omitempty"`
	}
	type rel struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
	purl := func(path, version string) []extRef {
		return []extRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/" + path + "@" + version}}
	}
	version := info.Main.Version
	if v := spec.Labels[LabelVersion]; v != "" && (version == "" || version == "(devel)") {
		version = v
	}
	pkgs := []pkg{{Name: info.Main.Path, SPDXID: "SPDXRef-Package-main", Version: version, DownloadLocation: "NOASSERTION",
		ExternalRefs: purl(info.Main.Path, version), Comment: "the image's program, " + binPath[strings.LastIndex(binPath, "/")+1:]}}
	rels := []rel{{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: "SPDXRef-Package-main"}}
	goVersion := strings.TrimPrefix(info.GoVersion, "go")
	pkgs = append(pkgs, pkg{Name: "stdlib", SPDXID: "SPDXRef-Package-stdlib", Version: goVersion,
		DownloadLocation: "https://go.dev/dl/", ExternalRefs: purl("stdlib", goVersion)})
	rels = append(rels, rel{Element: "SPDXRef-Package-main", Type: "DEPENDS_ON", Related: "SPDXRef-Package-stdlib"})
	deps := modules(info)
	sort.Slice(deps, func(i, j int) bool { return deps[i].path < deps[j].path })
	for i, d := range deps {
		id := fmt.Sprintf("SPDXRef-Package-go-%d", i)
		p := pkg{Name: d.path, SPDXID: id, Version: d.version, DownloadLocation: "https://proxy.golang.org/" + d.path,
			ExternalRefs: purl(d.path, d.version)}
		if h, ok := strings.CutPrefix(d.sum, "h1:"); ok {
			p.Comment = "go.sum h1:" + h
		}
		pkgs = append(pkgs, p)
		rels = append(rels, rel{Element: "SPDXRef-Package-main", Type: "DEPENDS_ON", Related: id})
	}
	// Debian packages the image carries files of (their dpkg status, packageFiles).
	for _, l := range spec.Layers {
		for _, f := range l.Files {
			if !strings.HasPrefix(f.Path, dpkgStatusDir+"/") || len(f.Data) == 0 {
				continue
			}
			fields := StanzaFields(string(f.Data))
			if fields["Package"] == "" || fields["Version"] == "" {
				continue
			}
			id := fmt.Sprintf("SPDXRef-Package-deb-%s", strings.NewReplacer("+", "-", ".", "-", ":", "-").Replace(fields["Package"]))
			locator := "pkg:deb/debian/" + fields["Package"] + "@" + fields["Version"]
			if a := fields["Architecture"]; a != "" {
				locator += "?arch=" + a
			}
			pkgs = append(pkgs, pkg{Name: fields["Package"], SPDXID: id, Version: fields["Version"], DownloadLocation: "NOASSERTION",
				ExternalRefs: []extRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: locator}},
				Comment:      "Debian package; its status in " + f.Path})
			rels = append(rels, rel{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: id})
		}
	}
	var files []string
	for _, l := range spec.Layers {
		if l.Name == "base" {
			continue
		}
		for _, f := range l.Files {
			if !f.Mode.IsDir() {
				files = append(files, f.Path)
			}
		}
	}
	sort.Strings(files)
	if len(files) > 0 {
		pkgs = append(pkgs, pkg{Name: "image files", SPDXID: "SPDXRef-Package-files", DownloadLocation: "NOASSERTION",
			Comment: "files of the image beyond its base: " + strings.Join(files, " ")})
		rels = append(rels, rel{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: "SPDXRef-Package-files"})
	}
	doc := map[string]any{
		"spdxVersion":       "SPDX-2.3",
		"dataLicense":       "CC0-1.0",
		"SPDXID":            "SPDXRef-DOCUMENT",
		"name":              name,
		"documentNamespace": "https://understory.io/spdx/" + strings.NewReplacer(":", "-", "/", "-", " ", "-").Replace(name),
		"creationInfo": map[string]any{
			"created":  created.UTC().Format(time.RFC3339),
			"creators": []string{"Tool: understory-mkimage"},
		},
		"packages":      pkgs,
		"relationships": rels,
	}
	return json.MarshalIndent(doc, "", "  ")
}

// debugModule is one module linked into a binary (a replaced one as its replacement).
type debugModule struct{ path, version, sum string }

func modules(info *buildinfo.BuildInfo) []debugModule {
	out := make([]debugModule, 0, len(info.Deps))
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		out = append(out, debugModule{d.Path, d.Version, d.Sum})
	}
	return out
}

// StanzaFields reads the single-line fields of a dpkg status stanza (Package,
// Version, Architecture, ...).
func StanzaFields(stanza string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(stanza, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(line, " ") {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}
