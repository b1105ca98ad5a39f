"""A stand-in for PyTorch in the tests of bench/gpureal's stand-ins (no GPU, no torch):
just the calls ls.py and batch.py make. FAKE_TORCH_CUDA=0: no CUDA device.

Device memory (standin.Memory): uint8 tensors from empty() count against a device of
FAKE_TORCH_MEM_MIB (81920), or against device 0's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT where
the process has one, as CUDA under MPS would refuse past it; an allocation past it raises
cuda.OutOfMemoryError. Only this process's own tensors count. FAKE_TORCH_IGNORE_LIMIT=1:
the limit is ignored (a CUDA that does not honour it)."""
import os
import time

__version__ = "0.0+fake"
bfloat16 = "bfloat16"
uint8 = "uint8"

_MIB = 1 << 20


def _limit_bytes():
    if os.environ.get("FAKE_TORCH_IGNORE_LIMIT") == "1":
        return None
    for e in os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").split(","):
        ordinal, _, val = e.partition("=")
        if ordinal == "0" and len(val) > 1 and val[-1] in "MG" and val[:-1].isdigit():
            return int(val[:-1]) * (1024 if val[-1] == "G" else 1) * _MIB
    return None


class _Memory:
    total = int(os.environ.get("FAKE_TORCH_MEM_MIB", "81920")) * _MIB
    limit = _limit_bytes()
    used = 0


class _OutOfMemoryError(RuntimeError):
    pass


class _Cuda:
    OutOfMemoryError = _OutOfMemoryError

    @staticmethod
    def is_available():
        return os.environ.get("FAKE_TORCH_CUDA", "1") == "1"

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def get_device_name(index):
        return "fake GPU %d" % index

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def mem_get_info():
        most = _Memory.total if _Memory.limit is None else min(_Memory.total, _Memory.limit)
        return most - _Memory.used, _Memory.total


cuda = _Cuda()


class _Bool:
    def __init__(self, v):
        self.v = v

    def all(self):
        return self

    def item(self):
        return self.v


class _Tensor:
    """A uint8 device tensor: its size counts while it lives; it holds one value."""

    def __init__(self, nbytes):
        most = _Memory.total if _Memory.limit is None else min(_Memory.total, _Memory.limit)
        if _Memory.used + nbytes > most:
            raise _OutOfMemoryError("CUDA out of memory. Tried to allocate %d MiB (fake)" % (nbytes // _MIB))
        _Memory.used += nbytes
        self.nbytes, self.value = nbytes, 0

    def fill_(self, v):
        self.value = v
        return self

    def __eq__(self, v):
        return _Bool(self.value == v)

    def __del__(self):
        _Memory.used -= self.nbytes


def device(name):
    return name


def randn(*shape, device=None, dtype=None):
    return shape


def empty(*shape, device=None, dtype=None):
    if dtype == uint8:
        n = 1
        for d in shape:
            n *= d
        return _Tensor(n)
    return shape


def matmul(a, b, out=None):
    time.sleep(0.0001)
    return out
