package main

import (
	"context"
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
