package colo

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/understory/understory/cgroups"
)

// The memory scenario's pods are this binary re-executed, like `ls-server` and `burner`:
//
//   - `mem-ls`: the LS service. It holds an anonymous working set (an in-memory index)
//     and serves from a data file it reads through the page cache with
//     POSIX_FADV_RANDOM, as a key-value store does (RocksDB's advise_random_on_open).
//     A request touches random pages of the index and reads random 4 KiB blocks of the
//     file: while the file is cached a read costs microseconds, once its pages are
//     reclaimed every read is a disk read, and the service's latency shows it.
//   - `mem-batch`: a batch job. It sizes its heap from the memory it sees, as the JVM,
//     Spark or Ray do (its cgroup's limit, else the nearest one above it: in a
//     BestEffort pod, the whole node), grows it steadily, and reads its dataset again
//     and again, epoch after epoch, as a training job does, so its page cache grows
//     until its cgroup, or the node, is short.
const (
	memLSCmd    = "mem-ls"
	memBatchCmd = "mem-batch"
	// memReady starts the line a memory pod prints once it runs in its cgroups (and, for
	// the LS service, once its data is warm and it listens); a batch job adds the heap
	// size it chose, in bytes.
	memReady = "mem ready"
	pageSize = 4096
)

// podFlags are what every memory pod is started with: where it runs and how the kernel
// ranks it for the OOM killer.
type podFlags struct {
	root, cgroup string
	oomScoreAdj  int
}

func (p *podFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.root, "cgroup-root", "/sys/fs/cgroup", "cgroup mount")
	fs.StringVar(&p.cgroup, "cgroup", "", "pod cgroup to join first (every controller, memory included)")
	fs.IntVar(&p.oomScoreAdj, "oom-score-adj", 0, "oom_score_adj, as kubelet sets it for the pod's QoS class")
}

// enter joins the pod's cgroup in every controller, memory included (AddProcMemory),
// first thing, so that nothing it allocates is charged elsewhere, and sets
// oom_score_adj.
func (p *podFlags) enter() error {
	if p.oomScoreAdj < -1000 || p.oomScoreAdj > 1000 {
		return fmt.Errorf("-oom-score-adj %d: must be within [-1000, 1000]", p.oomScoreAdj)
	}
	if p.cgroup != "" {
		h, err := cgroups.Open(p.root)
		if err != nil {
			return err
		}
		g, err := h.Load(p.cgroup)
		if err != nil {
			return err
		}
		if err := g.AddProcMemory(os.Getpid()); err != nil {
			return err
		}
	}
	return os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(p.oomScoreAdj)), 0)
}

// openData opens a pod's data file and returns its size.
func openData(path string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// touchPages writes one byte per page so that the memory is resident (and charged).
func touchPages(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		b[i] = byte(i>>12) | 1
	}
}

// memLS is the memory scenario's LS service.
type memLS struct {
	index   []byte   // anonymous working set
	data    *os.File // read through the page cache
	blocks  int64
	reads   int // 4 KiB blocks read per request
	touches int // index pages touched per request
	rounds  int // SHA-256 rounds per request (a little CPU work)
}

func runMemLS(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(memLSCmd, flag.ContinueOnError)
	var pf podFlags
	pf.register(fs)
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	anon := fs.Int64("anon", 64<<20, "anonymous working set, bytes")
	data := fs.String("data", "", "data file read through the page cache")
	reads := fs.Int("reads", 16, "random 4 KiB reads of the data file per request")
	touches := fs.Int("touches", 64, "random pages of the working set touched per request")
	rounds := fs.Int("rounds", 50, "SHA-256 rounds per request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *anon < pageSize || *data == "" || *reads < 0 || *touches < 0 || *rounds < 0 {
		return errors.New("mem-ls: -anon (≥ 4096), -data are required; -reads, -touches, -rounds must be ≥ 0")
	}
	if err := pf.enter(); err != nil {
		return err
	}
	f, size, err := openData(*data)
	if err != nil {
		return err
	}
	defer f.Close()
	if size < pageSize {
		return fmt.Errorf("mem-ls: data file %s is smaller than one block", *data)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		return fmt.Errorf("mem-ls: fadvise: %w", err)
	}
	s := &memLS{index: make([]byte, *anon), data: f, blocks: size / pageSize,
		reads: *reads, touches: *touches, rounds: *rounds}
	touchPages(s.index)
	if err := s.warm(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/work", s.work)
	mux.HandleFunc("/warm", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if err := s.warm(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Println(memReady)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	case err := <-errc:
		return fmt.Errorf("mem-ls: %w", err)
	}
}

// warm reads the whole data file twice, as a service warms its cache at start: the
// second access makes the kernel count the pages as active (its working set).
func (s *memLS) warm() error {
	buf := make([]byte, 1<<20)
	for range 2 {
		for off := int64(0); ; {
			n, err := s.data.ReadAt(buf, off)
			off += int64(n)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("warming %s: %w", s.data.Name(), err)
			}
		}
	}
	return nil
}

func (s *memLS) work(w http.ResponseWriter, _ *http.Request) {
	var sum uint64
	pages := len(s.index) / pageSize
	for range s.touches {
		sum += uint64(s.index[rand.IntN(pages)*pageSize+rand.IntN(pageSize)])
	}
	var blk [pageSize]byte
	for range s.reads {
		if _, err := s.data.ReadAt(blk[:], rand.Int64N(s.blocks)*pageSize); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		sum += uint64(blk[int(sum)%pageSize])
	}
	h := sha256.Sum256(blk[:])
	for range s.rounds {
		h = sha256.Sum256(h[:])
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(strconv.FormatUint(sum+uint64(h[0]), 10)))
}

// memBatch is the state of one batch job.
type memBatch struct {
	heap     [][]byte
	size     int64 // bytes allocated so far
	data     *os.File
	dataSize int64
	pos      int64
	buf      []byte
}

func runMemBatch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(memBatchCmd, flag.ContinueOnError)
	var pf podFlags
	pf.register(fs)
	heapShare := fs.Float64("heap-share", 0.7, "share of the memory it sees (its cgroup's limit, else its parents', else the machine's) the job grows its heap to")
	grow := fs.Int64("grow", 128<<20, "heap growth, bytes/s")
	data := fs.String("data", "", "dataset read again and again through the page cache")
	readRate := fs.Int64("read", 128<<20, "dataset read rate, bytes/s")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *heapShare < 0 || *heapShare > 1 || *grow <= 0 || *readRate <= 0 || *data == "" {
		return errors.New("mem-batch: -data is required; -heap-share must be within [0, 1], -grow and -read > 0")
	}
	if err := pf.enter(); err != nil {
		return err
	}
	// Sized once at start, like a JVM's heap: a limit set later is met by the OOM killer.
	h, err := cgroups.Open(pf.root)
	if err != nil {
		return err
	}
	mh, err := openMemHier(h)
	if err != nil {
		return err
	}
	sees, err := mh.visibleLimit(pf.cgroup, "/proc")
	if err != nil {
		return err
	}
	heap := int64(float64(sees) * *heapShare)
	f, size, err := openData(*data)
	if err != nil {
		return err
	}
	defer f.Close()
	b := &memBatch{data: f, dataSize: size, buf: make([]byte, 1<<20)}
	fmt.Println(memReady, heap)
	const tick = 20 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	last, lastTouch := time.Now(), time.Now()
	var readDebt float64
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			dt := now.Sub(last).Seconds()
			last = now
			if b.size < heap {
				b.grow(min(heap-b.size, max(pageSize, int64(float64(*grow)*dt))))
			}
			readDebt += float64(*readRate) * dt
			for readDebt >= float64(len(b.buf)) {
				n, err := b.read()
				if err != nil {
					return err
				}
				readDebt -= float64(n)
			}
			// The job works on its heap: touched every second, as a job uses its data.
			if now.Sub(lastTouch) >= time.Second {
				lastTouch = now
				for _, c := range b.heap {
					touchPages(c)
				}
			}
		}
	}
}

func (b *memBatch) grow(n int64) {
	c := make([]byte, n)
	touchPages(c)
	b.heap = append(b.heap, c)
	b.size += n
}

// read reads the next block of the dataset, from the start again at its end.
func (b *memBatch) read() (int, error) {
	if b.dataSize == 0 {
		return len(b.buf), nil
	}
	n, err := b.data.ReadAt(b.buf, b.pos)
	b.pos += int64(n)
	if errors.Is(err, io.EOF) || b.pos >= b.dataSize {
		b.pos, err = 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", b.data.Name(), err)
	}
	return max(n, 1), nil
}
