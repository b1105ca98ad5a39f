// Command gpu-real is the real-GPU benchmark, make bench-gpu-real (built as
// bin/gpureal-bench by make bench-gpu-real-build): the stand-ins, the agent and the
// phases are bench/gpureal; this is its entry point. The binary is re-executed as the
// stand-ins' launcher and as the GPU-free fakes, sub-commands it serves first.
//
// Exit status: 0 done, 1 failed, 2 no NVIDIA GPU on this machine.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/understory/understory/bench/gpureal"
)

func main() {
	if handled, err := gpureal.Dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); handled {
		if err != nil {
			fmt.Fprintln(os.Stderr, "gpureal-bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := gpureal.Main(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gpureal-bench:", err)
		if errors.Is(err, gpureal.ErrNoGPU) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
