"""Load an MNIST-layout dataset: torchvision's MNIST where it imports, else an own IDX reader.

Both give the same tensors: float32 images (1, 28, 28) normalised with MNIST's mean and std,
and int64 labels after collation. Hosts with torch but no torchvision (the container test
hosts) read the same files through ``read_idx``.
"""

from __future__ import annotations

import gzip
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, TensorDataset

import make_data

MEAN, STD = 0.1307, 0.3081
_ALL_FILES = [name for pair in make_data.FILES.values() for name in pair]


class DataError(Exception):
    """No usable dataset where one was expected; the message says where and what to do."""
    exit_code = 2


@dataclass(frozen=True)
class Splits:
    train: Dataset
    test: Dataset
    reader: str  # "torchvision" or "idx"
    source: str  # what the files are, said plainly for logs and metrics.json


def _torchvision():
    """torchvision's (MNIST, transforms), or None where it is missing or cannot load."""
    try:
        from torchvision import transforms
        from torchvision.datasets import MNIST
    # Not only ImportError: a torchvision built for another torch fails while registering ops.
    except Exception:
        return None
    return MNIST, transforms


def read_idx(path: Path) -> torch.Tensor:
    """An IDX file of unsigned bytes (plain or .gz) as a uint8 tensor of its stored shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e}") from e
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise DataError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    offset = 4 + 4 * ndim
    dims = struct.unpack_from(f">{ndim}I", data, 4) if len(data) >= offset else ()
    if len(dims) != ndim or len(data) - offset != math.prod(dims):
        raise DataError(f"{path} is truncated or has a wrong header")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=offset).reshape(dims)


def normalise(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28) by ToTensor's and Normalize's arithmetic."""
    mean = torch.tensor([MEAN], dtype=torch.float32)
    std = torch.tensor([STD], dtype=torch.float32)
    return images.unsqueeze(1).to(torch.float32).div(255).sub_(mean).div_(std)


def _idx_split(raw: Path, split: str) -> TensorDataset:
    image_name, label_name = make_data.FILES[split]
    images = read_idx(_existing(raw, image_name))
    labels = read_idx(_existing(raw, label_name))
    if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28):
        raise DataError(f"{raw / image_name}: expected N x 28 x 28 images, got "
                        f"{tuple(images.shape)}")
    if labels.dim() != 1 or len(labels) != len(images):
        raise DataError(f"{raw}: {len(images)} {split} images but labels of shape "
                        f"{tuple(labels.shape)}")
    return TensorDataset(normalise(images), labels.long())


def _existing(raw: Path, name: str) -> Path:
    plain = raw / name
    return plain if plain.is_file() else raw / f"{name}.gz"


def load(root: Path, use_torchvision: bool | None = None) -> Splits:
    """Both splits of the dataset under ``root`` (torchvision's layout, ``root/MNIST/raw``).

    ``use_torchvision`` None picks torchvision when it imports and the uncompressed files it
    insists on are there; True or False forces a reader (tests compare the two).
    """
    raw = make_data.raw_dir(root)
    if not make_data.dataset_present(root):
        missing = [n for n in _ALL_FILES
                   if not (raw / n).is_file() and not (raw / f"{n}.gz").is_file()]
        raise DataError(
            f"no MNIST data in {raw.resolve()} (missing {', '.join(missing)}); make it with "
            f"'python train_job/make_data.py --out {root}' or pass --synthetic")
    tv = _torchvision()
    if use_torchvision is None:
        use_torchvision = tv is not None and all((raw / n).is_file() for n in _ALL_FILES)
    elif use_torchvision and tv is None:
        raise DataError("torchvision was asked for but does not import here")

    if use_torchvision:
        mnist, transforms = tv
        transform = transforms.Compose([transforms.ToTensor(),
                                        transforms.Normalize((MEAN,), (STD,))])
        train = mnist(str(root), train=True, download=False, transform=transform)
        test = mnist(str(root), train=False, download=False, transform=transform)
    else:
        train, test = _idx_split(raw, "train"), _idx_split(raw, "test")

    marker = make_data.read_marker(root)
    if marker is not None:
        source = f"synthetic digits from train_job/make_data.py (seed {marker['seed']})"
    else:
        source = "MNIST-format IDX files not generated by make_data.py"
    return Splits(train, test, "torchvision" if use_torchvision else "idx", source)
