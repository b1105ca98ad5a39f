// Package images builds Understory's OCI images without a Docker engine or a
// registry, with go-containerregistry: each layer is a tar made here from a list of
// files, appended to empty.Image with mutate.Append, given its config with
// mutate.ConfigFile, and written as a `docker save`-style tarball (tarball.Write)
// that `ctr images import`, `docker load`, `podman load`, `kind load image-archive`
// and `crane push` all read. cmd/mkimage is the command line; `make images` and
// scripts/realnode/build.sh run it.
//
//   - spec.go: File, Layer, Spec and Build (the image), WriteTarball (the file).
//   - layer.go: the deterministic layer tar of a list of files.
//   - elf.go: ReadBinary (interpreter, DT_NEEDED, architecture of an ELF) and
//     RuntimeFiles (the loader and the libraries a dynamically linked binary needs).
//   - dir.go: FilesFromDir, a prepared root file system as a list of files.
//   - project.go: the project's images (Components, ProjectSpec): one per deployed
//     binary, tagged with the version.
//   - binary.go: BinarySpec, the image of one prebuilt binary that is not the
//     project's (upstream kube-scheduler for the real node, which has no network),
//     over the same base layer, under the reference and at the path given.
//
// Traps:
//   - Reproducible: every file's mtime, the config's created time and the history
//     times are Spec.Created (SOURCE_DATE_EPOCH in cmd/mkimage, else the Unix
//     epoch); owners are numeric (File.UID/GID, no names); entries are sorted and
//     every parent directory is an explicit entry. The same inputs give the same
//     layer digests, image ID and tarball bytes (a test checks it). Hard links are
//     not kept: each name is its own copy.
//   - Never `:latest`: Build refuses a reference without an explicit tag, and the
//     tag "latest". Manifests name images by the version (the repository's VERSION file).
//   - The tarball has no manifest of its own (the Docker format keeps the config and
//     layers; importers write the manifest), so what must survive is in the config:
//     the OCI labels (org.opencontainers.image.version, title, description), the
//     user and the entrypoint. Registries and containerd compute their own manifest
//     digest; the image ID (config digest) is the stable identity.
//   - containerd and kubelet normalise "understory/koordlet:v1" to
//     "docker.io/understory/koordlet:v1"; the tarball keeps the short name, which
//     both importers normalise the same way, so pods naming the short name find it.
//   - A cgo binary links glibc dynamically: RuntimeFiles copies its ELF interpreter
//     (PT_INTERP, e.g. /lib64/ld-linux-x86-64.so.2) and every DT_NEEDED library,
//     recursively, from the build host into the image. The image has no
//     ld.so.cache, so the libraries go where the loader looks without one: the
//     directory the interpreter really lives in (glibc's slibdir, e.g.
//     /usr/lib/x86_64-linux-gnu on Debian; a test asks the host's loader with
//     `ld.so --help`). They are looked up in that directory first, then in the
//     default directories of multiarch and lib64 systems; RPATH, RUNPATH and
//     ld.so.conf are ignored, which is right for Go binaries (they have none).
//     Symlinks below root resolve inside root, so a sysroot with absolute links works.
//     A file of another machine or class is skipped, as glibc does. Libraries
//     opened with dlopen at run time (libnvidia-ml.so.1) are not found this way and
//     are not copied: the node provides them (see project.go).
//   - Layers are built in memory (the agent's is ~50 MB) and gzip-compressed once
//     (tarball.WithCompressedCaching).
package images
