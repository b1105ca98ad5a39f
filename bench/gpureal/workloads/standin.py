"""What the two stand-ins of make bench-gpu-real share (ls.py, batch.py): the JSON-lines
protocol with the driver (commands on stdin, events on stdout, logs on stderr), the lazy
PyTorch import with its clear failure, the bf16 operands and the ready event."""
import json
import os
import queue
import sys
import threading

ENV_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_CLIENT_PRIORITY", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


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
