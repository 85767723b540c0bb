"""Generate a learnable, MNIST-shaped digit dataset in torchvision's on-disk layout.

No machine of this project can download MNIST, so this writes synthetic handwritten-looking
digits (strokes of ten glyphs under a random affine warp, jitter, thickness and ink) as the four
uncompressed IDX files torchvision.datasets.MNIST(root, download=False) reads:
``<out>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``.

The bytes depend only on (train, test, seed): every random draw comes from numpy's legacy
RandomState, whose streams numpy keeps stable across versions, and the rendering uses only
+ - * / sqrt and min, which IEEE 754 rounds the same on every machine (no sin/exp/sum whose
results vary by library or SIMD path). Hosts that generate independently get identical files.

CLI: python train_job/make_data.py --out data [--train N] [--test M] [--seed S] [--force]
Needs numpy only.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

SIZE = 28
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MARKER = "SYNTHETIC.json"
DEFAULT_TRAIN, DEFAULT_TEST, DEFAULT_SEED = 10_000, 2_000, 0
_FORMAT_VERSION = 1
_CHUNK = 512  # samples rendered at once: keeps the (chunk, segments, 784) arrays in cache

# Each glyph is a list of polylines in a unit box (x right, y down). Curves are written out as
# points rather than computed with cos/sin so that no libm result enters the bytes.
_O = [(.82, .50), (.78, .73), (.66, .90), (.50, .96), (.34, .90), (.22, .73), (.18, .50),
      (.22, .27), (.34, .10), (.50, .04), (.66, .10), (.78, .27), (.82, .50)]
_GLYPHS = [
    [_O],
    [[(.34, .22), (.54, .05), (.54, .95)]],
    [[(.20, .25), (.32, .09), (.52, .04), (.72, .10), (.80, .27), (.72, .45), (.20, .95),
      (.85, .95)]],
    [[(.20, .12), (.45, .04), (.72, .12), (.74, .32), (.45, .48), (.78, .62), (.78, .84),
      (.52, .96), (.20, .88)]],
    [[(.66, .95), (.66, .05), (.14, .66), (.86, .66)]],
    [[(.80, .05), (.28, .05), (.24, .44), (.50, .38), (.74, .48), (.80, .70), (.66, .90),
      (.42, .96), (.20, .88)]],
    [[(.70, .05), (.48, .18), (.32, .40), (.26, .62), (.30, .84), (.48, .95), (.66, .88),
      (.74, .70), (.66, .54), (.48, .48), (.32, .56), (.26, .66)]],
    [[(.15, .05), (.85, .05), (.60, .50), (.42, .95)]],
    [[(.72, .27), (.66, .43), (.50, .49), (.34, .43), (.28, .27), (.34, .11), (.50, .05),
      (.66, .11), (.72, .27)],
     [(.77, .72), (.69, .89), (.50, .96), (.31, .89), (.23, .72), (.31, .55), (.50, .48),
      (.69, .55), (.77, .72)]],
    [[(.70, .30), (.64, .46), (.48, .52), (.32, .46), (.26, .30), (.32, .14), (.48, .08),
      (.64, .14), (.70, .30), (.66, .62), (.55, .95)]],
]
_MAX_POINTS = max(sum(len(line) for line in glyph) for glyph in _GLYPHS)


def raw_dir(root: Path) -> Path:
    return Path(root) / "MNIST" / "raw"


def dataset_present(root: Path) -> bool:
    """True when all four IDX files exist, uncompressed or as the .gz files MNIST ships as."""
    raw = raw_dir(root)
    names = [name for pair in FILES.values() for name in pair]
    return all((raw / n).is_file() or (raw / f"{n}.gz").is_file() for n in names)


def _glyph_arrays(digit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Control points of one glyph and the start/end indices of its segments."""
    points, starts = [], []
    for line in _GLYPHS[digit]:
        base = len(points)
        points.extend(line)
        starts.extend(range(base, base + len(line) - 1))
    starts_arr = np.array(starts)
    return np.array(points, dtype=np.float64), starts_arr, starts_arr + 1


def _render(digit: int, warp: np.ndarray, jitter: np.ndarray, ink: np.ndarray,
            grain: np.ndarray) -> np.ndarray:
    """Images (n, 28, 28) uint8 of one digit, one per row of the per-sample draws."""
    points, starts, ends = _glyph_arrays(digit)
    n = len(warp)
    # Glyph box -> the central 20x20 pixels, as MNIST centres its digits; jitter per point.
    p = 4.0 + 20.0 * (points[None] + jitter[:, :len(points)]) - 14.0
    scale, a, b, c, d, tx, ty, half_width = (warp[:, i:i + 1] for i in range(8))
    x = scale * ((1.0 + a) * p[..., 0] + b * p[..., 1]) + 14.0 + tx
    y = scale * (c * p[..., 0] + (1.0 + d) * p[..., 1]) + 14.0 + ty
    x, y = x.astype(np.float32), y.astype(np.float32)

    ax, ay = x[:, starts, None], y[:, starts, None]
    ex, ey = x[:, ends, None] - ax, y[:, ends, None] - ay
    length2 = np.maximum(ex * ex + ey * ey, np.float32(1e-6))
    rows, cols = np.divmod(np.arange(SIZE * SIZE, dtype=np.float32), np.float32(SIZE))
    dx, dy = cols[None, None] - ax, rows[None, None] - ay
    t = np.clip((dx * ex + dy * ey) / length2, 0, 1)
    qx, qy = dx - t * ex, dy - t * ey
    dist = np.sqrt((qx * qx + qy * qy).min(axis=1))
    # One pixel of anti-aliased edge around a stroke of the drawn half-width.
    cover = np.clip(half_width.astype(np.float32) + np.float32(0.5) - dist, 0, 1)
    value = cover * (ink[:, None] + grain).astype(np.float32)
    return np.rint(np.clip(value, 0, 255)).astype(np.uint8).reshape(n, SIZE, SIZE)


def generate(n: int, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (uint8, n x 28 x 28) and labels (uint8), balanced over the ten digits."""
    rs = np.random.RandomState([seed, stream])
    labels = rs.permutation(np.arange(n) % 10).astype(np.uint8)
    # Per sample: scale, the four affine entries around identity, shift x/y, stroke half-width.
    lows = np.array([0.72, -0.15, -0.32, -0.32, -0.15, -1.5, -1.5, 0.7])
    highs = np.array([0.96, 0.15, 0.32, 0.32, 0.15, 1.5, 1.5, 1.7])
    warp = lows + (highs - lows) * rs.random_sample((n, 8))
    jitter = rs.uniform(-0.085, 0.085, (n, _MAX_POINTS, 2))
    ink = rs.uniform(170.0, 255.0, n)
    images = np.empty((n, SIZE, SIZE), dtype=np.uint8)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        grain = rs.uniform(-40.0, 40.0, (stop - start, SIZE * SIZE))
        chunk = labels[start:stop]
        for digit in range(10):
            idx = np.nonzero(chunk == digit)[0]
            if len(idx):
                rows = start + idx
                images[rows] = _render(digit, warp[rows], jitter[rows], ink[rows], grain[idx])
    return images, labels


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file (big-endian dims, unsigned bytes) as LeCun's MNIST files are stored."""
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _marker(train: int, test: int, seed: int, label_digests: dict[str, str]) -> dict:
    return {"generator": "train_job/make_data.py", "format_version": _FORMAT_VERSION,
            "train": train, "test": test, "seed": seed, "label_sha256": label_digests}


def write_dataset(root: Path, train: int = DEFAULT_TRAIN, test: int = DEFAULT_TEST,
                  seed: int = DEFAULT_SEED) -> None:
    """Write all four IDX files and the SYNTHETIC.json marker, each atomically."""
    raw = raw_dir(root)
    raw.mkdir(parents=True, exist_ok=True)
    digests = {}
    for stream, (split, n) in enumerate((("train", train), ("test", test))):
        images, labels = generate(n, seed, stream)
        image_name, label_name = FILES[split]
        _write_atomic(raw / image_name, idx_bytes(images))
        label_data = idx_bytes(labels)
        _write_atomic(raw / label_name, label_data)
        digests[label_name] = hashlib.sha256(label_data).hexdigest()
    # Written last, so a marker never describes files that are not all there.
    text = json.dumps(_marker(train, test, seed, digests), indent=2, sort_keys=True) + "\n"
    _write_atomic(raw / MARKER, text.encode())


def read_marker(root: Path) -> dict | None:
    """The generator's marker if it still describes the label files on disk, else None.

    Checking the label digests keeps the claim honest when real MNIST was later copied over a
    generated set.
    """
    raw = raw_dir(root)
    try:
        marker = json.loads((raw / MARKER).read_text())
        for name, digest in marker["label_sha256"].items():
            if hashlib.sha256((raw / name).read_bytes()).hexdigest() != digest:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker


def ensure_dataset(root: Path, train: int = DEFAULT_TRAIN, test: int = DEFAULT_TEST,
                   seed: int = DEFAULT_SEED) -> bool:
    """Generate the dataset under ``root`` unless one is there; True if this call wrote it.

    Several ranks on one host may call this at once: an exclusive lock makes one of them write
    while the others wait and then find the files present.
    """
    if dataset_present(root):
        return False
    raw = raw_dir(root)
    raw.mkdir(parents=True, exist_ok=True)
    with open(raw / ".make_data.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dataset_present(root):
            return False
        write_dataset(root, train, test, seed)
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data"),
                        help="dataset root; files go to OUT/MNIST/raw (default: data)")
    parser.add_argument("--train", type=int, default=DEFAULT_TRAIN, help="training samples")
    parser.add_argument("--test", type=int, default=DEFAULT_TEST, help="held-out samples")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--force", action="store_true",
                        help="overwrite a dataset that is already there")
    args = parser.parse_args(argv)
    if min(args.train, args.test) < 1 or args.seed < 0:
        parser.error("--train and --test must be positive and --seed non-negative")

    raw = raw_dir(args.out)
    if dataset_present(args.out) and not args.force:
        marker = read_marker(args.out) or {}
        wanted = {"format_version": _FORMAT_VERSION, "train": args.train, "test": args.test,
                  "seed": args.seed}
        if all(marker.get(k) == v for k, v in wanted.items()):
            print(f"{raw}: already holds this dataset ({args.train} train, {args.test} test, "
                  f"seed {args.seed})")
            return 0
        print(f"error: {raw} already holds a different dataset; pass --force to overwrite it",
              file=sys.stderr)
        return 1
    write_dataset(args.out, args.train, args.test, args.seed)
    print(f"wrote {args.train} train and {args.test} test synthetic digits (seed {args.seed}) "
          f"to {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
