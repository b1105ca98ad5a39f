#!/usr/bin/env python3
"""LS inference stand-in of make bench-gpu-real (bench/gpureal, docs/benchmarks.md).

An open loop of requests at --rate per second; each request is --matmuls bf16
--size x --size matmuls and a synchronize (17 x 4096: about 3.3 ms alone on an H200).
Latency is measured from each request's scheduled send time, so a request that waits
behind a late one counts its wait.

Protocol (JSON lines; the driver writes commands on stdin, this writes events on stdout,
logs on stderr):
  {"cmd":"run","phase":P,"start":UNIX,"end":UNIX,"mode":"run"|"idle"}
      run: requests scheduled every 1/rate from start until end (end 0: until stop);
      idle: hold the CUDA context and send nothing until end or stop.
  {"cmd":"stop"}   end the current run now.   {"cmd":"quit"}   exit.
  {"cmd":"mem",...}   device memory for the memory-cap check (standin.Memory).
  -> {"event":"ready",...} once, after the CUDA context and a warm-up;
     {"event":"result","phase":P,"start":UNIX,"sched":[s],"lat_ms":[ms],"unsent":N} per run;
     {"event":"mem",...} per mem command;
     {"event":"error","error":TEXT} before exiting non-zero.
PyTorch is imported lazily: without it, or without a CUDA device, the stand-in says so
and exits 3.
"""
import argparse
import time

from standin import Memory, commands, emit, fail, load_torch, operands, ready

# A run gives up this long after its end: requests still unsent count with the
# latency they had reached (a lower bound), so one stuck phase cannot hang the bench.
GIVE_UP_AFTER = 5.0


def sleep_until(t, stop):
    while not stop.is_set():
        d = t - time.time()
        if d <= 0:
            return
        time.sleep(min(d, 0.05))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--matmuls", type=int, default=17)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=50, help="warm-up requests")
    args = ap.parse_args()
    if args.rate <= 0 or args.matmuls <= 0 or args.size <= 0:
        fail("--rate, --matmuls and --size must be positive", 2)

    torch = load_torch()
    a, b, c = operands(torch, args.size)

    def request():
        for _ in range(args.matmuls):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()

    warm = []
    for _ in range(args.warmup):
        t = time.perf_counter()
        request()
        warm.append((time.perf_counter() - t) * 1e3)
    warm.sort()
    ready(torch, warm[len(warm) // 2] if warm else 0)

    mem = Memory(torch)
    cmds, stop = commands()
    period = 1.0 / args.rate
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
        sched, lat, unsent = [], [], 0
        if cmd.get("mode") == "idle":
            while not stop.is_set() and (end == 0 or time.time() < end):
                time.sleep(0.01)
        else:
            i = 0
            while not stop.is_set():
                ts = start + i * period
                if end and ts >= end:
                    break
                now = time.time()
                if end and now > end + GIVE_UP_AFTER:
                    # Hopelessly behind: the rest are unsent, at the latency reached.
                    while ts < end:
                        sched.append(ts - start)
                        lat.append((now - ts) * 1e3)
                        unsent += 1
                        i += 1
                        ts = start + i * period
                    break
                if now < ts:
                    sleep_until(ts, stop)
                    if stop.is_set():
                        break
                request()
                done = time.time()
                sched.append(ts - start)
                lat.append((done - ts) * 1e3)
                i += 1
        emit({"event": "result", "phase": cmd.get("phase", ""), "start": start, "sched": sched,
              "lat_ms": lat, "unsent": unsent})


if __name__ == "__main__":
    main()
