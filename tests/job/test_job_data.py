"""The generated dataset and both readers of the MNIST layout."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import make_data  # noqa: E402  (conftest puts train_job/ on the path)
import mnist_idx  # noqa: E402
from jobproc import job_env  # noqa: E402

pytestmark = pytest.mark.job

MAKE_DATA = Path(make_data.__file__)


def _all_samples(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    loader = torch.utils.data.DataLoader(dataset, batch_size=len(dataset))
    return next(iter(loader))


def test_generated_bytes_are_pinned() -> None:
    """Hosts that generate independently must get the same bytes: the digest is fixed.

    Seen equal with numpy 1.26.4 and 2.4.6, with and without AVX2/AVX-512 dispatch; a change
    here means every host's generated data changes.
    """
    digest = hashlib.sha256()
    for stream in (0, 1):
        images, labels = make_data.generate(300, 7, stream)
        digest.update(make_data.idx_bytes(images) + make_data.idx_bytes(labels))
    assert digest.hexdigest() == "8dba83635f8ad0d27c16e26fa551b6fdc2cb81caed761359dccf1fe150fd7832"


def test_generation_is_seeded_balanced_and_digit_like() -> None:
    images, labels = make_data.generate(500, 1, 0)
    again, same_labels = make_data.generate(500, 1, 0)
    assert np.array_equal(images, again) and np.array_equal(labels, same_labels)
    assert not np.array_equal(images, make_data.generate(500, 2, 0)[0])
    assert images.shape == (500, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels, minlength=10).tolist() == [50] * 10
    # MNIST-like: a dark background, some saturated ink, the outermost pixels nearly all blank.
    assert 0.08 < (images > 0).mean() < 0.35 and images.max() == 255
    border = np.concatenate([images[:, 0], images[:, -1], images[:, :, 0], images[:, :, -1]])
    assert (border > 0).mean() < 0.005


def test_dataset_files_have_the_mnist_layout(tmp_path: Path) -> None:
    make_data.write_dataset(tmp_path, train=40, test=20, seed=0)
    raw = tmp_path / "MNIST" / "raw"
    images = (raw / "train-images-idx3-ubyte").read_bytes()
    assert images[:16] == bytes.fromhex("00000803" "00000028" "0000001c" "0000001c")
    assert len(images) == 16 + 40 * 28 * 28
    labels = (raw / "t10k-labels-idx1-ubyte").read_bytes()
    assert labels[:8] == bytes.fromhex("00000801" "00000014") and len(labels) == 8 + 20
    assert make_data.read_marker(tmp_path)["seed"] == 0
    assert not list(raw.glob("*.tmp"))


def test_make_data_cli_refuses_to_overwrite_other_data(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(MAKE_DATA), "--out", str(tmp_path), *args],
                              env=job_env(), capture_output=True, text=True, timeout=60)

    first = cli("--train", "100", "--test", "50", "--seed", "3")
    assert first.returncode == 0, first.stderr
    assert cli("--train", "100", "--test", "50", "--seed", "3").returncode == 0
    other = cli("--train", "200", "--test", "50", "--seed", "3")
    assert other.returncode == 1 and "--force" in other.stderr
    assert cli("--train", "200", "--test", "50", "--force").returncode == 0
    assert json.loads((tmp_path / "MNIST/raw/SYNTHETIC.json").read_text())["train"] == 200


def test_ensure_dataset_keeps_what_is_there(tmp_path: Path) -> None:
    make_data.write_dataset(tmp_path, train=30, test=10, seed=5)
    before = (tmp_path / "MNIST/raw/train-images-idx3-ubyte").read_bytes()
    assert make_data.ensure_dataset(tmp_path) is False
    assert (tmp_path / "MNIST/raw/train-images-idx3-ubyte").read_bytes() == before


def test_readers_give_identical_tensors(digits: Path) -> None:
    """torchvision's MNIST and the own IDX reader: same values, dtypes and shapes."""
    if mnist_idx._torchvision() is None:
        pytest.skip("torchvision does not import here; the IDX reader is the only one")
    tv = mnist_idx.load(digits, use_torchvision=True)
    own = mnist_idx.load(digits, use_torchvision=False)
    assert (tv.reader, own.reader) == ("torchvision", "idx")
    for split in ("train", "test"):
        tv_images, tv_labels = _all_samples(getattr(tv, split))
        own_images, own_labels = _all_samples(getattr(own, split))
        assert tv_images.dtype == own_images.dtype == torch.float32
        assert tv_labels.dtype == own_labels.dtype == torch.int64
        assert torch.equal(tv_images, own_images) and torch.equal(tv_labels, own_labels)


def test_gz_files_read_like_plain_ones(tmp_path: Path, digits: Path) -> None:
    raw = make_data.raw_dir(tmp_path)
    raw.mkdir(parents=True)
    for plain in make_data.raw_dir(digits).glob("*-ubyte"):
        with gzip.open(raw / f"{plain.name}.gz", "wb") as f:
            f.write(plain.read_bytes())
    gz, plain = mnist_idx.load(tmp_path), mnist_idx.load(digits, use_torchvision=False)
    assert gz.reader == "idx"  # torchvision insists on uncompressed files
    for a, b in zip(_all_samples(gz.test), _all_samples(plain.test)):
        assert torch.equal(a, b)
    assert gz.source == "MNIST-format IDX files not generated by make_data.py"


def test_normalisation_matches_mnist_constants(digits: Path) -> None:
    images, _ = _all_samples(mnist_idx.load(digits, use_torchvision=False).test)
    assert images.shape[1:] == (1, 28, 28)
    assert images.min().item() == pytest.approx(-0.1307 / 0.3081, abs=1e-6)
    assert images.max().item() == pytest.approx((1 - 0.1307) / 0.3081, abs=1e-6)


def test_missing_data_names_the_path_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(mnist_idx.DataError) as info:
        mnist_idx.load(tmp_path / "nothing")
    message = str(info.value)
    assert str(tmp_path / "nothing" / "MNIST" / "raw") in message
    assert "python train_job/make_data.py --out" in message and "--synthetic" in message


def test_truncated_idx_file_is_rejected(tmp_path: Path, digits: Path) -> None:
    shutil.copytree(digits, tmp_path / "d")
    images = tmp_path / "d/MNIST/raw/t10k-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-1])
    with pytest.raises(mnist_idx.DataError, match="truncated"):
        mnist_idx.load(tmp_path / "d", use_torchvision=False)


def test_marker_is_not_trusted_once_files_change(tmp_path: Path) -> None:
    make_data.write_dataset(tmp_path, train=30, test=10, seed=0)
    labels = tmp_path / "MNIST/raw/train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:8] + bytes(30))
    assert make_data.read_marker(tmp_path) is None
    assert mnist_idx.load(tmp_path, use_torchvision=False).source.startswith("MNIST-format")
