"""Configuration (flags, then torchrun's and clusterrun's environment) and the rendezvous.

Flags win; each distributed setting otherwise falls back to what the launcher put in the
environment: ``RANK``/``WORLD_SIZE`` (torchrun, clusterrun), ``CLUSTERRUN_DIST_URL``,
``CLUSTERRUN_DIST_BACKEND`` and ``CLUSTERRUN_TIMEOUT`` (clusterrun), then plain defaults.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for gloo
DEFAULT_PORT = 29500  # torchrun's default MASTER_PORT


class UsageError(Exception):
    """Flags or environment that cannot work; nothing was started."""
    exit_code = 2


class RendezvousError(Exception):
    """The ranks did not all meet: master unreachable, or fewer ranks than the world size."""
    exit_code = 3


@dataclass(frozen=True)
class JobConfig:
    rank: int
    world_size: int
    local_rank: int | None  # LOCAL_RANK when a launcher set it; picks the GPU under nccl
    dist_url: str
    master: str | None  # HOST:PORT of the rendezvous server; None for file://
    dist_backend: str
    timeout_s: float
    sync: str
    epochs: int
    batch_size: int  # per rank
    lr: float
    momentum: float
    seed: int
    data_dir: Path
    data_size: int | None  # use only the first K training samples
    synthetic: bool
    out: Path
    log_every: int
    checkpoint_dir: Path | None = None  # every epoch saved here, the newest resumed from; None: neither


def error_line(rank: int | None, message: str) -> str:
    return f"[rank {'?' if rank is None else rank}] error: {message}"


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m`` or ``2h``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", text)
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90, 90s, 30m or 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def format_duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_job/train.py",
        description="Train the tutorials' ConvNet on MNIST-layout digits with "
                    "torch.distributed (one process per rank).")
    d = p.add_argument_group("distributed (flags win over RANK, WORLD_SIZE, CLUSTERRUN_*)")
    d.add_argument("--rank", type=int, help="this process's rank (default: $RANK, else 0)")
    d.add_argument("--world-size", type=int,
                   help="number of ranks (default: $WORLD_SIZE, else 1)")
    d.add_argument("--dist-url", help="tcp://HOST:PORT, file:///shared/path or env:// "
                   "(default: $CLUSTERRUN_DIST_URL, else env:// when $MASTER_ADDR is set, "
                   f"else tcp://127.0.0.1:{DEFAULT_PORT})")
    d.add_argument("--dist-backend", choices=("gloo", "nccl"),
                   help="default: $CLUSTERRUN_DIST_BACKEND, else nccl with CUDA, else gloo")
    d.add_argument("--timeout", type=parse_duration,
                   help="rendezvous and collective timeout, e.g. 90 or 30m "
                        "(default: $CLUSTERRUN_TIMEOUT seconds, else 30m)")
    d.add_argument("--sync", choices=("ddp", "allreduce"), default="ddp",
                   help="DistributedDataParallel, or the tutorials' average_gradients")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=int, default=2, help="default: %(default)s")
    t.add_argument("--batch-size", type=int, default=64, help="per rank (default: %(default)s)")
    t.add_argument("--lr", type=float, default=0.02,
                   help="SGD learning rate (default: %(default)s)")
    t.add_argument("--momentum", type=float, default=0.9, help="default: %(default)s")
    t.add_argument("--seed", type=int, default=0,
                   help="model init and data order, the same on every rank (default: 0)")
    t.add_argument("--data-dir", type=Path, default=Path("data"),
                   help="dataset root in torchvision's layout, DIR/MNIST/raw (default: data)")
    t.add_argument("--data-size", type=int, help="train on the first K samples only")
    t.add_argument("--synthetic", action="store_true",
                   help="generate the make_data.py dataset in --data-dir if none is there")
    t.add_argument("--out", type=Path, default=Path("out"),
                   help="metrics, checkpoint and per-rank digests go here (default: out)")
    t.add_argument("--log-every", type=int, default=20,
                   help="progress line every N steps (default: %(default)s)")
    t.add_argument("--checkpoint-dir", type=Path,
                   help="save every epoch here and resume from the newest one found "
                        "(default: $CLUSTERRUN_CHECKPOINT_DIR; none: no checkpoints)")
    return p


def _env_int(environ: Mapping[str, str], name: str, fallback: int | None) -> int | None:
    if name not in environ:
        return fallback
    try:
        return int(environ[name])
    except ValueError:
        raise UsageError(f"${name} is {environ[name]!r}, not an integer") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_url(environ: Mapping[str, str], world_size: int) -> str:
    if environ.get("CLUSTERRUN_DIST_URL"):
        return environ["CLUSTERRUN_DIST_URL"]
    if environ.get("MASTER_ADDR"):
        return "env://"
    # A lone process by hand needs no agreed port, so it cannot collide with another run.
    return f"tcp://127.0.0.1:{_free_port() if world_size == 1 else DEFAULT_PORT}"


def _master_of(url: str, environ: Mapping[str, str]) -> str | None:
    """HOST:PORT the ranks will meet at (None for file://), after checking the URL works."""
    parsed = urlparse(url)
    if parsed.scheme == "tcp":
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None:
            raise UsageError(f"--dist-url {url}: tcp:// needs HOST:PORT")
        return f"{parsed.hostname}:{port}"
    if parsed.scheme == "env":
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(v)]
        if missing:
            raise UsageError(f"--dist-url env:// needs ${' and $'.join(missing)} set")
        return f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    if parsed.scheme != "file" or not parsed.path:
        raise UsageError(f"--dist-url {url}: use tcp://HOST:PORT, file:///shared/path or env://")
    return None


def parse_config(argv: list[str] | None, environ: Mapping[str, str]) -> JobConfig:
    args = _parser().parse_args(argv)
    rank, world_size = _rank_and_world_size(args, environ)
    backend = _backend(args, environ)
    timeout = _timeout(args, environ)
    url = args.dist_url or _default_url(environ, world_size)
    master = _master_of(url, environ)
    _check_counts(args)
    return JobConfig(
        rank=rank, world_size=world_size,
        local_rank=_env_int(environ, "LOCAL_RANK", None),
        dist_url=url, master=master, dist_backend=backend, timeout_s=timeout or DEFAULT_TIMEOUT_S,
        sync=args.sync, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        momentum=args.momentum, seed=args.seed, data_dir=args.data_dir,
        data_size=args.data_size, synthetic=args.synthetic, out=args.out,
        log_every=args.log_every, checkpoint_dir=_checkpoint_dir(args, environ))


def _rank_and_world_size(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[int, int]:
    rank = args.rank if args.rank is not None else _env_int(environ, "RANK", 0)
    world_size = (args.world_size if args.world_size is not None
                  else _env_int(environ, "WORLD_SIZE", 1))
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size


def _backend(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    backend = args.dist_backend or environ.get("CLUSTERRUN_DIST_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo")
    if backend not in ("gloo", "nccl"):
        raise UsageError(f"backend {backend!r}: use gloo or nccl")
    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("nccl needs CUDA, which this host lacks; use --dist-backend gloo")
    return backend


def _timeout(args: argparse.Namespace, environ: Mapping[str, str]) -> float | None:
    """--timeout, else $CLUSTERRUN_TIMEOUT; None: neither (the default applies)."""
    if args.timeout is None and environ.get("CLUSTERRUN_TIMEOUT"):
        try:
            return parse_duration(environ["CLUSTERRUN_TIMEOUT"])
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"$CLUSTERRUN_TIMEOUT: {e}") from None
    return args.timeout


def _check_counts(args: argparse.Namespace) -> None:
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size),
                        ("--log-every", args.log_every), ("--data-size", args.data_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, not {value}")


def _checkpoint_dir(args: argparse.Namespace, environ: Mapping[str, str]) -> Path | None:
    if args.checkpoint_dir:
        return args.checkpoint_dir
    return Path(environ["CLUSTERRUN_CHECKPOINT_DIR"]) if environ.get("CLUSTERRUN_CHECKPOINT_DIR") else None


def rendezvous_failure(cfg: JobConfig, phase: str, error: BaseException | None) -> str:
    """One line that leads with what most likely went wrong, for the phase that failed."""
    detail = str(error).strip().splitlines()[0][:240] if error and str(error).strip() else ""
    text = _likely_cause(cfg, phase, error, detail, format_duration(cfg.timeout_s))
    return f"{text} [{detail}]" if detail else text


def _timed_out(error: BaseException | None, detail: str) -> bool:
    """The deadline fired (no error), or torch's error says it timed out."""
    return error is None or isinstance(error, dist.DistStoreError) or any(
        word in detail.lower() for word in ("timeout", "timed out"))


def _likely_cause(cfg: JobConfig, phase: str, error: BaseException | None, detail: str, limit: str) -> str:
    timed_out = _timed_out(error, detail)
    if phase == "store" and cfg.master and cfg.rank != 0:
        return (f"cannot reach the master at {cfg.master} within the {limit} timeout "
                f"({cfg.dist_url}); is rank 0 running and its port open?")
    if phase == "store" and cfg.master and not timed_out:
        return f"rank 0 cannot serve the rendezvous at {cfg.master} ({cfg.dist_url})"
    if cfg.master and not timed_out and (isinstance(error, dist.DistNetworkError)
                                         or "closed" in detail.lower()):
        return (f"the rendezvous server at {cfg.master} went away before all ranks joined "
                f"(expected world size {cfg.world_size}, {limit} timeout); see rank 0's error")
    if timed_out:
        return (f"not all ranks joined within the {limit} timeout: expected world size "
                f"{cfg.world_size} at {cfg.dist_url}; was every rank started, each with "
                f"--world-size {cfg.world_size}?")
    return f"could not set up the {cfg.dist_backend} process group ({cfg.dist_url})"


class _Deadline:
    """Ends the process with a one-line error if the rendezvous outlives its timeout.

    torch retries a refused connect past the timeout (about twice it) and blocks in C++ where
    Python cannot interrupt it, so a timer thread keeps the promise of --timeout itself.
    """

    def __init__(self, seconds: float, message: Callable[[], str], rank: int) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._message, self._rank = message, rank
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            sys.stdout.flush()
            sys.stderr.write(error_line(self._rank, self._message()) + "\n")
            sys.stderr.flush()
            os._exit(RendezvousError.exit_code)

    def cancel(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
        # No thread of ours may live on into interpreter shutdown beside torch's C++ threads.
        self._timer.join()


def init_distributed(cfg: JobConfig, device: torch.device) -> None:
    """``init_process_group`` as the tutorials call it, in two steps so failures say which."""
    phase = "store"
    deadline = _Deadline(cfg.timeout_s, lambda: rendezvous_failure(cfg, phase, None), cfg.rank)
    timeout = timedelta(seconds=cfg.timeout_s)
    try:
        store, _, _ = next(dist.rendezvous(cfg.dist_url, cfg.rank, cfg.world_size,
                                           timeout=timeout))
        store.set_timeout(timeout)
        phase = "group"
        # The prefix is what init_process_group(init_method=...) adds; under torchrun the store
        # is the agent's and shared with it.
        dist.init_process_group(cfg.dist_backend, store=dist.PrefixStore("default_pg", store),
                                rank=cfg.rank, world_size=cfg.world_size, timeout=timeout)
        # Everyone is here only once a collective has gone through (nccl connects lazily).
        dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    except (RuntimeError, ValueError) as e:  # torch's DistError family derives from RuntimeError
        raise RendezvousError(rendezvous_failure(cfg, phase, e)) from None
    finally:
        deadline.cancel()
