package runqlat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// The slow-event wake-up: while armed, the first delay at or above the
// threshold disarms the gate and writes one record to a ring buffer (see
// bpf/runqlat.c); a goroutine blocked on the ring buffer turns it into a
// value on Wake. A poller then sleeps until the kernel has something for it,
// instead of waking every few milliseconds to look at SlowEvents.
//
// Ring buffers are Linux 5.8+. Before, the object without them is loaded
// (runqlatpoll_bpfel.o) and Arm fails with ErrNoWake: poll SlowEvents.

// ErrNoWake: the kernel has no BPF ring buffers (before Linux 5.8), so the
// probe cannot wake its reader; Arm fails with it and Wake is nil.
var ErrNoWake = errors.New("slow-event wake-up not supported")

// slowRecord is bpf/runqlat.c's struct slow_event.
const slowRecordSize = 16

// notifier owns the wake-up's maps and the goroutine reading the ring buffer.
type notifier struct {
	armed  *ebpf.Map // hash, key 0 present: armed
	events *ebpf.Map // the ring buffer
	rd     *ringbuf.Reader
	f      *os.File // events' fd again, in the runtime's netpoller
	wake   chan struct{}
	done   chan struct{}
	// records is how many records the kernel wrote; lastKey and lastDelay the
	// newest one's (tests, logs).
	records            atomic.Uint64
	lastKey, lastDelay atomic.Uint64
}

// haveRingbuf is whether this kernel can create BPF ring buffers.
func haveRingbuf() bool { return features.HaveMapType(ebpf.RingBuf) == nil }

// newNotifier creates the wake-up maps of s (the ring-buffer object) for the
// programs to use (replacements), sized to the page: the smallest ring.
func newNotifier(s *ebpf.CollectionSpec) (*notifier, error) {
	as, es := s.Maps[runqlatMapArmed], s.Maps[runqlatMapEvents]
	if as == nil || es == nil {
		return nil, fmt.Errorf("runqlat: the ring-buffer object lacks its maps")
	}
	// A replacement must match its spec: size the spec itself.
	es.MaxEntries = uint32(os.Getpagesize())
	armed, err := ebpf.NewMap(as)
	if err != nil {
		return nil, classify(fmt.Errorf("runqlat: creating the wake-up gate: %w", err))
	}
	events, err := ebpf.NewMap(es)
	if err != nil {
		_ = armed.Close()
		return nil, classify(fmt.Errorf("runqlat: creating the wake-up ring buffer: %w", err))
	}
	return &notifier{armed: armed, events: events, wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// replacements are the maps the programs must use; nil without a notifier.
func (n *notifier) replacements() map[string]*ebpf.Map {
	if n == nil {
		return nil
	}
	return map[string]*ebpf.Map{runqlatMapArmed: n.armed, runqlatMapEvents: n.events}
}

// start opens the ring buffer and starts the goroutine reading it.
//
// ringbuf.Reader.Read would park an OS thread in epoll_wait for the life of
// the probe. The goroutine waits in the runtime's netpoller instead, on a
// non-blocking duplicate of the map's fd (a ring buffer's fd is pollable),
// and drains the reader with a deadline in the past: it never blocks.
func (n *notifier) start() error {
	rd, err := ringbuf.NewReader(n.events)
	if err != nil {
		return classify(fmt.Errorf("runqlat: reading the wake-up ring buffer: %w", err))
	}
	rd.SetDeadline(time.Unix(1, 0))
	fd, err := unix.FcntlInt(uintptr(n.events.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err == nil {
		if err = unix.SetNonblock(fd, true); err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		_ = rd.Close()
		return fmt.Errorf("runqlat: polling the wake-up ring buffer: %w", err)
	}
	n.rd, n.f = rd, os.NewFile(uintptr(fd), "bpf-ringbuf:events")
	rc, err := n.f.SyscallConn()
	if err != nil {
		_ = n.f.Close()
		_ = rd.Close()
		return fmt.Errorf("runqlat: polling the wake-up ring buffer: %w", err)
	}
	go n.run(rc)
	return nil
}

// run turns records into wake-ups until the file is closed (or polling it
// fails: then Wake is closed, and the reader polls SlowEvents). Several
// records before the receiver looks are one wake-up: it reads every histogram
// anyway.
func (n *notifier) run(rc syscall.RawConn) {
	defer close(n.done)
	defer close(n.wake)
	var rec ringbuf.Record
	failed := false
	drain := func(uintptr) bool {
		got := false
		for {
			err := n.rd.ReadInto(&rec)
			if err != nil {
				// os.ErrDeadlineExceeded: empty. Anything else ends the reader.
				failed = !errors.Is(err, os.ErrDeadlineExceeded)
				break
			}
			got = true
			if len(rec.RawSample) >= slowRecordSize {
				n.lastKey.Store(binary.NativeEndian.Uint64(rec.RawSample))
				n.lastDelay.Store(binary.NativeEndian.Uint64(rec.RawSample[8:]))
			}
			n.records.Add(1)
		}
		if got {
			select {
			case n.wake <- struct{}{}:
			default:
			}
		}
		// false: wait until the fd is readable again (edge-triggered: a record
		// after this drain makes it so), then drain again.
		return failed
	}
	for !failed {
		if err := rc.Read(drain); err != nil {
			return // closed
		}
	}
}

// arm sets the gate: the next slow delay writes a record.
func (n *notifier) arm() error {
	var key, one uint32 = 0, 1
	if err := n.armed.Update(&key, &one, ebpf.UpdateAny); err != nil {
		return classify(fmt.Errorf("runqlat: arming the slow-event wake-up: %w", err))
	}
	return nil
}

// close stops the goroutine (Wake is closed) and frees the maps. Call it
// after the programs are detached.
func (n *notifier) close() error {
	var errs []error
	if n.rd != nil {
		errs = append(errs, n.f.Close()) // ends run's wait
		<-n.done
		errs = append(errs, n.rd.Close())
	}
	errs = append(errs, n.armed.Close(), n.events.Close())
	return errors.Join(errs...)
}
