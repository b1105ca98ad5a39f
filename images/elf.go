package images

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// Sentinel errors of the ELF reading.
var (
	// ErrNotELF: the file is not an ELF executable this package understands.
	ErrNotELF = errors.New("not a supported ELF file")
	// ErrLibraryNotFound: a DT_NEEDED library is in none of the searched directories.
	ErrLibraryNotFound = errors.New("shared library not found")
	// ErrNotStatic: a binary that must be statically linked has an interpreter.
	ErrNotStatic = errors.New("binary is not statically linked")
)

// Binary is what an image needs to know about an executable.
type Binary struct {
	Path string
	// Arch is the GOARCH spelling of the ELF machine (amd64, arm64, ...).
	Arch string
	// Interp is the program interpreter (PT_INTERP); empty for a static binary.
	Interp string
	// Needed are the DT_NEEDED entries, in order.
	Needed []string
}

// Static reports whether the binary runs without a loader and libraries.
func (b Binary) Static() bool { return b.Interp == "" && len(b.Needed) == 0 }

// machine is what glibc matches a library against: machine, class and byte order.
type machine struct {
	m     elf.Machine
	class elf.Class
	data  elf.Data
}

// archOf maps an ELF machine to GOARCH and Debian's multiarch triplet.
func archOf(m machine) (goarch, triplet string, ok bool) {
	switch m {
	case machine{elf.EM_X86_64, elf.ELFCLASS64, elf.ELFDATA2LSB}:
		return "amd64", "x86_64-linux-gnu", true
	case machine{elf.EM_AARCH64, elf.ELFCLASS64, elf.ELFDATA2LSB}:
		return "arm64", "aarch64-linux-gnu", true
	case machine{elf.EM_386, elf.ELFCLASS32, elf.ELFDATA2LSB}:
		return "386", "i386-linux-gnu", true
	case machine{elf.EM_ARM, elf.ELFCLASS32, elf.ELFDATA2LSB}:
		return "arm", "arm-linux-gnueabihf", true
	case machine{elf.EM_PPC64, elf.ELFCLASS64, elf.ELFDATA2LSB}:
		return "ppc64le", "powerpc64le-linux-gnu", true
	case machine{elf.EM_S390, elf.ELFCLASS64, elf.ELFDATA2MSB}:
		return "s390x", "s390x-linux-gnu", true
	case machine{elf.EM_RISCV, elf.ELFCLASS64, elf.ELFDATA2LSB}:
		return "riscv64", "riscv64-linux-gnu", true
	}
	return "", "", false
}

// elfInfo is one parsed ELF file.
type elfInfo struct {
	machine
	interp string
	needed []string
	soname string
}

func readELF(p string) (elfInfo, error) {
	osf, err := os.Open(p)
	if err != nil {
		return elfInfo{}, err
	}
	defer osf.Close()
	// The file opened: whatever elf.NewFile refuses (bad magic, too short) is not an
	// ELF this package can use.
	f, err := elf.NewFile(osf)
	if err != nil {
		return elfInfo{}, fmt.Errorf("%w: %s: %w", ErrNotELF, p, err)
	}
	info := elfInfo{machine: machine{f.Machine, f.Class, f.Data}}
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			return elfInfo{}, fmt.Errorf("%s: read PT_INTERP: %w", p, err)
		}
		info.interp = strings.TrimRight(string(b), "\x00")
	}
	// A static binary has no dynamic section: ImportedLibraries returns nil, nil.
	if info.needed, err = f.ImportedLibraries(); err != nil {
		return elfInfo{}, fmt.Errorf("%s: DT_NEEDED: %w", p, err)
	}
	if names, err := f.DynString(elf.DT_SONAME); err == nil && len(names) > 0 {
		info.soname = names[0]
	}
	return info, nil
}

// ReadBinary reads the architecture, interpreter and DT_NEEDED of the executable p.
func ReadBinary(p string) (Binary, error) {
	info, err := readELF(p)
	if err != nil {
		return Binary{}, err
	}
	goarch, _, ok := archOf(info.machine)
	if !ok {
		return Binary{}, fmt.Errorf("%w: %s: machine %s class %s", ErrNotELF, p, info.m, info.class)
	}
	return Binary{Path: p, Arch: goarch, Interp: info.interp, Needed: info.needed}, nil
}

// libDirs are where RuntimeFiles looks for a library on the build host: the
// loader's own directory first, then the directories glibc searches by default on
// Debian-like (multiarch) and Fedora-like (lib64) systems.
func libDirs(slibdir, triplet string) []string {
	return []string{slibdir, "/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
}

// RuntimeFiles returns what the executable binPath needs to start in an image
// with nothing else, copied from below root (the build host: "/"): its interpreter
// at the PT_INTERP path, and every DT_NEEDED library, recursively, in the
// directory where the interpreter really lives (PT_INTERP with symlinks resolved,
// e.g. /usr/lib/x86_64-linux-gnu on Debian): glibc installs its loader in its
// slibdir, which the loader always searches, also with no ld.so.cache, as in the
// image. A static binary needs nothing: nil. The files are regular files (the
// content of a symlink's target), mode 0755, root's.
func RuntimeFiles(root, binPath string) ([]File, error) {
	bin, err := readELF(binPath)
	if err != nil {
		return nil, err
	}
	_, triplet, ok := archOf(bin.machine)
	if !ok {
		return nil, fmt.Errorf("%w: %s: machine %s class %s", ErrNotELF, binPath, bin.m, bin.class)
	}
	if bin.interp == "" && len(bin.needed) == 0 {
		return nil, nil
	}
	if bin.interp == "" || !path.IsAbs(bin.interp) {
		return nil, fmt.Errorf("%w: %s: interpreter %q, needs %v", ErrNotELF, binPath, bin.interp, bin.needed)
	}
	realInterp, err := resolveIn(root, bin.interp)
	if err != nil {
		return nil, fmt.Errorf("%s: interpreter: %w", binPath, err)
	}
	interp, err := readELF(filepath.Join(root, realInterp))
	if err != nil {
		return nil, fmt.Errorf("%s: interpreter: %w", binPath, err)
	}
	if interp.machine != bin.machine {
		return nil, fmt.Errorf("%w: interpreter %s is for %s, %s for %s", ErrNotELF, bin.interp, interp.m, binPath, bin.m)
	}
	files := []File{{Path: bin.interp, Mode: 0o755, Source: filepath.Join(root, realInterp)}}
	slibdir := path.Dir(realInterp)
	// satisfied holds the sonames already loaded: the loader maps a DT_NEEDED entry
	// to a loaded object of that soname without searching (libc needs ld-linux).
	satisfied := map[string]bool{path.Base(bin.interp): true}
	if interp.soname != "" {
		satisfied[interp.soname] = true
	}
	queue := append([]string(nil), bin.needed...)
	for len(queue) > 0 {
		soname := queue[0]
		queue = queue[1:]
		if satisfied[soname] {
			continue
		}
		src, lib, err := findLibrary(root, soname, bin.machine, libDirs(slibdir, triplet))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", binPath, err)
		}
		satisfied[soname] = true
		if lib.soname != "" {
			satisfied[lib.soname] = true
		}
		dst := path.Join(slibdir, soname)
		if strings.Contains(soname, "/") {
			dst = path.Clean("/" + soname) // the loader opens such a name as it is
		}
		files = append(files, File{Path: dst, Mode: 0o755, Source: filepath.Join(root, src)})
		queue = append(queue, lib.needed...)
	}
	return files, nil
}

// findLibrary finds soname as the loader would: a name with a slash is a path,
// otherwise the first file of that name in dirs that is an ELF of machine m. It
// returns the file's real path below root.
func findLibrary(root, soname string, m machine, dirs []string) (string, elfInfo, error) {
	candidates := make([]string, 0, len(dirs))
	if strings.Contains(soname, "/") {
		candidates = append(candidates, path.Clean("/"+soname))
	} else {
		for _, d := range dirs {
			candidates = append(candidates, path.Join(d, soname))
		}
	}
	for _, c := range candidates {
		real, err := resolveIn(root, c)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", elfInfo{}, err
		}
		st, err := os.Stat(filepath.Join(root, real))
		if err != nil {
			return "", elfInfo{}, err
		}
		if !st.Mode().IsRegular() {
			continue
		}
		info, err := readELF(filepath.Join(root, real))
		if err != nil || info.machine != m {
			// Not an ELF, or another architecture's library: the loader skips it too.
			continue
		}
		return real, info, nil
	}
	return "", elfInfo{}, fmt.Errorf("%w: %s (searched %s below %s)", ErrLibraryNotFound, soname,
		strings.Join(dirs, ", "), root)
}

// maxSymlinks bounds resolveIn, as the kernel's ELOOP does.
const maxSymlinks = 40

// resolveIn resolves every symlink in the absolute path p as if root were "/":
// an absolute target restarts at root, ".." stops at root. The result is a clean
// absolute path that exists below root and has no symlink in it.
func resolveIn(root, p string) (string, error) {
	// Not path.Clean first: ".." after a symlink goes up from the link's target.
	rest := strings.Split(p, "/")
	cur := "/"
	for hops := 0; len(rest) > 0; {
		part := rest[0]
		rest = rest[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, part)
		host := filepath.Join(root, filepath.FromSlash(next))
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > maxSymlinks {
			return "", fmt.Errorf("%s: %w", p, syscall.ELOOP)
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return cur, nil
}
