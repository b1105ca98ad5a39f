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
  -> {"event":"ready",...} once, after the CUDA context and a warm-up;
     {"event":"result","phase":P,"start":UNIX,"sched":[s],"lat_ms":[ms],"unsent":N} per run;
     {"event":"error","error":TEXT} before exiting non-zero.
PyTorch is imported lazily: without it, or without a CUDA device, the stand-in says so
and exits 3.
"""
import argparse
import json
import os
import queue
import sys
import threading
import time

ENV_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_CLIENT_PRIORITY", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")

# A run gives up this long after its end: requests still unsent count with the
# latency they had reached (a lower bound), so one stuck phase cannot hang the bench.
GIVE_UP_AFTER = 5.0


def emit(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def fail(msg, code=3):
    emit({"event": "error", "error": msg})
    print("ls.py: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def load_torch():
    try:
        import torch  # noqa: lazily, so that a machine without it gets a clear message
    except ImportError as e:
        fail("PyTorch is not installed (%s): the stand-ins run on the GPU machine, see "
             "docs/benchmarks.md" % e)
    if not torch.cuda.is_available():
        fail("PyTorch %s sees no CUDA device: run on the GPU machine (docs/benchmarks.md)"
             % torch.__version__)
    return torch


def reader(cmds, stop):
    for line in sys.stdin:
        try:
            c = json.loads(line)
        except ValueError:
            continue
        if c.get("cmd") == "stop":
            stop.set()
        else:
            cmds.put(c)
    cmds.put({"cmd": "quit"})


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
    dev = torch.device("cuda")
    a = torch.randn(args.size, args.size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=dev, dtype=torch.bfloat16)
    c = torch.empty(args.size, args.size, device=dev, dtype=torch.bfloat16)

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
    env = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}
    emit({"event": "ready", "pid": os.getpid(), "device": torch.cuda.get_device_name(0),
          "torch": torch.__version__, "env": env, "warm_ms": warm[len(warm) // 2] if warm else 0})

    cmds, stop = queue.Queue(), threading.Event()
    threading.Thread(target=reader, args=(cmds, stop), daemon=True).start()
    period = 1.0 / args.rate
    while True:
        cmd = cmds.get()
        if cmd.get("cmd") == "quit":
            return
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
