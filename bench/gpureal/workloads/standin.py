"""What the two stand-ins of make bench-gpu-real share (ls.py, batch.py): the JSON-lines
protocol with the driver (commands on stdin, events on stdout, logs on stderr), the lazy
PyTorch import with its clear failure, the bf16 operands, the ready event and the device
memory of the memory-cap check (Memory)."""
import json
import os
import queue
import sys
import threading

ENV_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_CLIENT_PRIORITY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")

MIB = 1 << 20
# A "grab" without a size stops at the first out-of-memory error, or at this bound
# (more than any GPU has).
GRAB_MOST_MIB = 1 << 20


def emit(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def fail(msg, code=3):
    emit({"event": "error", "error": msg})
    print(os.path.basename(sys.argv[0]) + ": " + msg, file=sys.stderr, flush=True)
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


def operands(torch, size):
    """Two random bf16 size x size matrices on the GPU and an output for their product."""
    dev = torch.device("cuda")
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    return a, b, torch.empty(size, size, device=dev, dtype=torch.bfloat16)


def ready(torch, warm_ms):
    """The ready event: the process, its device and the CUDA/MPS environment it got."""
    env = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}
    emit({"event": "ready", "pid": os.getpid(), "device": torch.cuda.get_device_name(0),
          "torch": torch.__version__, "env": env, "warm_ms": warm_ms})


def commands():
    """Starts the stdin reader: returns the queue of commands and the stop event ("stop"
    sets it; end of input sets it and queues a quit: the driver is gone)."""
    cmds, stop = queue.Queue(), threading.Event()

    def reader():
        for line in sys.stdin:
            try:
                c = json.loads(line)
            except ValueError:
                continue
            if c.get("cmd") == "stop":
                stop.set()
            else:
                cmds.put(c)
        stop.set()
        cmds.put({"cmd": "quit"})

    threading.Thread(target=reader, daemon=True).start()
    return cmds, stop


def is_oom(torch, e):
    """Whether e is CUDA's out-of-memory error as PyTorch raises it."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


class Memory:
    """Device memory for the memory-cap check (bench/gpureal/memcap.go), the "mem"
    command: {"cmd":"mem","phase":P,"op":OP,"mib":N,"chunk_mib":C}
      hold   allocate N MiB in chunks of C, each filled with its own value, and keep it;
      grab   allocate chunks until CUDA refuses (N 0) or N MiB, and keep them;
      check  whether every held chunk still holds its value, then allocate N MiB more
             and free it again;
      free   free everything held or grabbed.
    -> {"event":"mem","phase":P,"op":OP,"held_mib":..,"got_mib":..,"oom":..,"oom_error":..,
        "intact":.. (check),"free_mib":..,"total_mib":..} (torch.cuda.mem_get_info after it)."""

    def __init__(self, torch):
        self.torch = torch
        self.held = []     # (tensor, value, MiB)
        self.grabbed = []  # (tensor, None, MiB)

    def _alloc(self, mib, chunk, into, fill):
        """Allocates mib MiB (0: until refused) in chunks into `into`; returns the MiB
        got and the out-of-memory message ("" when it got all)."""
        got, most = 0, mib if mib > 0 else GRAB_MOST_MIB
        while got < most:
            n = min(chunk, most - got)
            try:
                t = self.torch.empty(n * MIB, dtype=self.torch.uint8, device="cuda")
                v = None
                if fill:
                    v = len(into) % 251 + 1
                    t.fill_(v)
            except RuntimeError as e:
                if not is_oom(self.torch, e):
                    raise
                return got, str(e)[:300] or "out of memory"
            into.append((t, v, n))
            got += n
        return got, ""

    def _release(self, chunks):
        chunks.clear()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()  # back to the driver, not only to PyTorch's cache

    def handle(self, cmd):
        op, mib = cmd.get("op"), int(cmd.get("mib") or 0)
        chunk = max(int(cmd.get("chunk_mib") or 256), 1)
        out = {"event": "mem", "phase": cmd.get("phase", ""), "op": op}
        err = ""
        if op == "hold":
            _, err = self._alloc(mib, chunk, self.held, True)
        elif op == "grab":
            out["got_mib"], err = self._alloc(mib, chunk, self.grabbed, False)
        elif op == "check":
            self.torch.cuda.synchronize()
            out["intact"] = all(bool((t == v).all().item()) for t, v, _ in self.held)
            extra = []
            out["got_mib"], err = self._alloc(mib, chunk, extra, False)
            self._release(extra)
        elif op == "free":
            self._release(self.held)
            self._release(self.grabbed)
        else:
            emit({"event": "error", "error": "unknown mem op %r" % op})
            return
        out["held_mib"] = sum(n for _, _, n in self.held)
        if err:
            out["oom"], out["oom_error"] = True, err
        free, total = self.torch.cuda.mem_get_info()
        out["free_mib"], out["total_mib"] = free / MIB, total / MIB
        emit(out)
