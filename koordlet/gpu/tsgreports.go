package gpu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/timeslice"
)

// Bounds on what the agent reads of one container's report directory, which the
// tenant writes: the names listed, the files parsed, and (devices.ShimReportMaxBytes)
// the bytes of each.
const (
	maxReportNames = 256
	maxReportFiles = 64
)

// shimContext is what a container's shim reported of one context (one time-slice
// group): its process as the container numbers it, its handles, the last allocation
// event, and the applications' own SET_TIMESLICE calls.
type shimContext struct {
	pid            int
	client, object uint32
	alloc          timeslice.Event
	hasAlloc       bool
	// appSets counts the applications' own sets; app is the one with the longest value
	// (hasApp: one carried a value).
	appSets int
	app     timeslice.Event
	hasApp  bool
}

// contextName is how /status and the reasons name a context: its handles.
func (c shimContext) contextName() string {
	return "client 0x" + hex8(c.client) + " group 0x" + hex8(c.object)
}

func hex8(v uint32) string {
	s := strconv.FormatUint(uint64(v), 16)
	return strings.Repeat("0", 8-len(s)) + s
}

// merge adds one event of the context.
func (c *shimContext) merge(e timeslice.Event) {
	switch e.Kind {
	case timeslice.KindAlloc:
		if !c.hasAlloc || e.UnixNano >= c.alloc.UnixNano {
			c.alloc, c.hasAlloc = e, true
		}
	case timeslice.KindAppSet:
		c.appSets++
		if e.HasApp && (!c.hasApp || e.AppUS > c.app.AppUS) {
			c.app, c.hasApp = e, true
		}
	}
}

// reportFile is one parsed report file, kept while its identity, size and time are
// unchanged.
type reportFile struct {
	dev, ino      uint64
	size, mtimeNs int64
	events        []timeslice.Event
	bad           int
	gen           uint64
}

// reportReader reads containers' report directories, parsing a file again only when it
// changed. Not safe for concurrent use (the GPU loop's).
type reportReader struct {
	files map[string]*reportFile
	gen   uint64
}

// begin starts a read of every directory; end forgets the files it did not read.
func (r *reportReader) begin() {
	if r.files == nil {
		r.files = map[string]*reportFile{}
	}
	r.gen++
}

func (r *reportReader) end() {
	for p, f := range r.files {
		if f.gen != r.gen {
			delete(r.files, p)
		}
	}
}

// readDir returns the contexts of a container's report directory by the process ID the
// lines give, and how many lines did not parse. Only files named tsg-<n>.log count;
// each is opened without following a link and read only if it is a regular file.
// Nothing read is trusted: the tenant writes the directory.
func (r *reportReader) readDir(dir string) (map[int][]shimContext, int) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, 0
	}
	names, _ := f.Readdirnames(maxReportNames)
	_ = f.Close()
	type key struct {
		pid            int
		client, object uint32
	}
	var order []key
	ctxs := map[key]*shimContext{}
	bad, files := 0, 0
	for _, n := range names {
		num, ok := strings.CutPrefix(n, "tsg-")
		if num, ok = strings.CutSuffix(num, ".log"); !ok || num == "" || strings.Trim(num, "0123456789") != "" {
			continue
		}
		if files++; files > maxReportFiles {
			break
		}
		rf := r.read(filepath.Join(dir, n))
		if rf == nil {
			continue
		}
		bad += rf.bad
		for _, e := range rf.events {
			k := key{e.PID, e.Client, e.Object}
			c := ctxs[k]
			if c == nil {
				c = &shimContext{pid: e.PID, client: e.Client, object: e.Object}
				ctxs[k] = c
				order = append(order, k)
			}
			c.merge(e)
		}
	}
	if len(ctxs) == 0 {
		return nil, bad
	}
	out := make(map[int][]shimContext, len(ctxs))
	for _, k := range order {
		out[k.pid] = append(out[k.pid], *ctxs[k])
	}
	return out, bad
}

// read parses one report file, or returns its last parse when unchanged; nil when it
// is not a regular file or cannot be read.
func (r *reportReader) read(path string) *reportFile {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	id := reportFile{size: fi.Size(), mtimeNs: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
	}
	if old := r.files[path]; old != nil && old.dev == id.dev && old.ino == id.ino && old.size == id.size &&
		old.mtimeNs == id.mtimeNs {
		old.gen = r.gen
		return old
	}
	events, bad, err := timeslice.ParseReport(f, devices.ShimReportMaxBytes)
	if err != nil {
		return nil
	}
	id.events, id.bad, id.gen = events, bad, r.gen
	r.files[path] = &id
	return &id
}
