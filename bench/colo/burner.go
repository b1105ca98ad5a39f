package colo

import (
	"context"
	"fmt"
	"runtime"
	"sync"
)

// burn keeps `threads` OS threads busy with arithmetic until ctx ends: the batch
// workload of the scenario. It touches almost no memory, so what it takes from the
// LS service is CPU time, not cache or memory bandwidth.
func burn(ctx context.Context, threads int) {
	var wg sync.WaitGroup
	for range threads {
		wg.Go(func() {
			runtime.LockOSThread()
			x := uint64(1)
			for {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				select {
				case <-ctx.Done():
					if x == 0 {
						println()
					}
					return
				default:
				}
			}
		})
	}
	wg.Wait()
}

// burnMemory keeps `threads` OS threads copying between the two halves of their share
// of a buffer of bufBytes until ctx ends: the membw variant's batch. A buffer far
// larger than the last-level cache makes every copy stream from and to DRAM, so
// besides CPU time it takes memory bandwidth and evicts the LS service's cache lines,
// which neither CPU weight nor quota accounts for. The buffer is allocated and touched
// before burnMemory returns ready (the caller prints the ready line after), so the
// page faults of the first pass do not fall into a measured phase.
func burnMemory(ctx context.Context, threads int, bufBytes int, ready func()) error {
	per := bufBytes / threads / 2
	if threads < 1 || per < 1 {
		return fmt.Errorf("memory burner: %d bytes over %d threads leaves nothing to copy", bufBytes, threads)
	}
	bufs := make([][]byte, threads)
	for i := range bufs {
		bufs[i] = make([]byte, 2*per)
		for j := 0; j < len(bufs[i]); j += 4096 {
			bufs[i][j] = byte(j)
		}
	}
	ready()
	var wg sync.WaitGroup
	for _, b := range bufs {
		wg.Go(func() {
			runtime.LockOSThread()
			lo, hi := b[:per], b[per:]
			for {
				// One pass each way: ~per bytes read and written, a few ms at DRAM speed
				// for the default 64 MiB halves, then a look at ctx.
				copy(hi, lo)
				copy(lo, hi)
				select {
				case <-ctx.Done():
					return
				default:
				}
			}
		})
	}
	wg.Wait()
	return nil
}
