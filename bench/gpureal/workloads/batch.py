#!/usr/bin/env python3
"""Batch training stand-in of make bench-gpu-real (bench/gpureal, docs/benchmarks.md).

bf16 --size x --size matmuls back to back, a synchronize every --every (8; the
deep-queue batch 64), so up to --every kernels wait in the GPU's queue. It reports the
time of each synchronize, from which the driver computes matmuls/s over any window and
a timeline (the recovery "within 2 s" after LS goes idle).

Protocol (JSON lines; commands on stdin, events on stdout, logs on stderr):
  {"cmd":"run","phase":P,"start":UNIX,"end":UNIX}   end 0: until {"cmd":"stop"}
  {"cmd":"stop"}   {"cmd":"quit"}
  {"cmd":"mem",...}   device memory for the memory-cap check (standin.Memory)
  -> {"event":"ready",...}; {"event":"result","phase":P,"start":UNIX,"syncs":[s],"every":N};
     {"event":"mem",...}; {"event":"error","error":TEXT}
PyTorch is imported lazily: without it, or without a CUDA device, the stand-in says so
and exits 3.
"""
import argparse
import time

from standin import Memory, commands, emit, fail, load_torch, operands, ready


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--every", type=int, default=8)
    args = ap.parse_args()
    if args.size <= 0 or args.every <= 0:
        fail("--size and --every must be positive", 2)

    torch = load_torch()
    a, b, c = operands(torch, args.size)

    def burst():
        for _ in range(args.every):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()

    t = time.perf_counter()
    for _ in range(2):
        burst()
    ready(torch, (time.perf_counter() - t) * 1e3 / 2)

    mem = Memory(torch)
    cmds, stop = commands()
    while True:
        cmd = cmds.get()
        if cmd.get("cmd") == "quit":
            return
        if cmd.get("cmd") == "mem":
            mem.handle(cmd)
            continue
        if cmd.get("cmd") != "run":
            continue
        stop.clear()
        start, end = float(cmd["start"]), float(cmd.get("end") or 0)
        while not stop.is_set() and time.time() < start:
            time.sleep(min(0.01, max(0.0, start - time.time())))
        syncs = []
        while not stop.is_set():
            now = time.time()
            if end and now >= end:
                break
            burst()
            syncs.append(time.time() - start)
        emit({"event": "result", "phase": cmd.get("phase", ""), "start": start, "syncs": syncs,
              "every": args.every})


if __name__ == "__main__":
    main()
