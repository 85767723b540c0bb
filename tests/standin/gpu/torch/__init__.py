"""A stand-in torch for the GPU preflight's CUDA op on hosts without a GPU (tests only): just what
clusterrun's op calls. Its mode is the words of the file `mode` in the folder above it, as for the
stand-in nvidia-smi: op-fail=N (GPU N raises CUDA's ECC error), op-hang=N (GPU N never synchronizes),
op-slow=N (GPU N takes 20x as long), gpus=N (how many GPUs it sees; default 2)."""
import os
import time

__version__ = "2.13.0+standin"


def _mode():
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "mode")) as fh:
            words = fh.read().split()
    except OSError:
        words = []
    return dict(w.split("=", 1) for w in words if "=" in w)


def _is(key, index):
    return str(index) in _mode().get(key, "").split(",")


class device:
    def __init__(self, kind, index=0):
        self.type, self.index = kind, index


class _Tensor:
    def __init__(self, dev):
        self.dev = dev

    def __matmul__(self, other):
        time.sleep(0.2 if _is("op-slow", self.dev.index) else 0.01)  # long enough that load does not halve it
        return self

    def float(self):
        return self

    def abs(self):
        return self

    def sum(self):
        return self

    def item(self):
        return 1.0


def randn(*shape, device=None):
    if _is("op-fail", device.index):
        raise RuntimeError("CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be "
                           "asynchronously reported")
    return _Tensor(device)


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        return int(_mode().get("gpus", 2))

    @staticmethod
    def synchronize(dev=None):
        if dev is not None and _is("op-hang", dev.index):
            time.sleep(3600)

    @staticmethod
    def get_device_name(index=0):
        return "NVIDIA A100-SXM4-80GB (stand-in)"


class version:
    cuda = "12.2"
