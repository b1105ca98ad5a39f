"""A stand-in for PyTorch in the tests of bench/gpureal's stand-ins (no GPU, no torch):
just the calls ls.py and batch.py make. FAKE_TORCH_CUDA=0: no CUDA device."""
import os
import time

__version__ = "0.0+fake"
bfloat16 = "bfloat16"


class _Cuda:
    @staticmethod
    def is_available():
        return os.environ.get("FAKE_TORCH_CUDA", "1") == "1"

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def get_device_name(index):
        return "fake GPU %d" % index


cuda = _Cuda()


def device(name):
    return name


def randn(*shape, device=None, dtype=None):
    return shape


def empty(*shape, device=None, dtype=None):
    return shape


def matmul(a, b, out=None):
    time.sleep(0.0001)
    return out
