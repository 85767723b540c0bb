"""Distributed training of the DDP tutorials' ConvNet on MNIST-layout digits, one process a rank.

Runs by hand (``--rank R --world-size N``), under torchrun (its environment alone) and under
clusterrun; see train_job/README.md. At the end every rank prints ``params sha256=<hex>`` and
writes OUT/rank-R.json; rank 0 writes OUT/metrics.json and OUT/checkpoint.pt.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

import checkpoints
import make_data
from convnet import ConvNet
from distsetup import (
    JobConfig,
    RendezvousError,
    UsageError,
    error_line,
    init_distributed,
    parse_config,
)
from mnist_idx import DataError, Splits, load

_EVAL_BATCH = 256


@dataclass(frozen=True)
class EpochStats:
    epoch: int
    wall_s: float  # the training steps of the epoch, as rank 0 timed them
    samples: int  # processed by all ranks together
    train_loss: float  # mean over every rank's samples
    train_acc: float
    test_loss: float  # the whole held-out split, sharded over the ranks
    test_acc: float


def emit(line: str, stream: TextIO | None = None) -> None:
    """One write per line: ranks sharing a terminal or file (torchrun) do not splice lines."""
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def log(cfg: JobConfig, text: str) -> None:
    emit(f"[rank {cfg.rank}] {text}")


def configure_threads(environ: Mapping[str, str]) -> int:
    """Share the cores among this host's ranks unless OMP_NUM_THREADS already says how."""
    if "OMP_NUM_THREADS" not in environ:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        local = environ.get("LOCAL_WORLD_SIZE", "")
        torch.set_num_threads(max(1, cores // max(1, int(local) if local.isdigit() else 1)))
    return torch.get_num_threads()


def pick_device(cfg: JobConfig) -> torch.device:
    if cfg.dist_backend != "nccl":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = cfg.local_rank if cfg.local_rank is not None else cfg.rank % count
    if not 0 <= index < count:
        raise UsageError(f"LOCAL_RANK is {index} but this host has {count} GPUs")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def prepare_data(cfg: JobConfig) -> tuple[Splits, Dataset]:
    if cfg.synthetic:
        try:
            if make_data.ensure_dataset(cfg.data_dir):
                log(cfg, f"generated synthetic digits in {make_data.raw_dir(cfg.data_dir)}")
        except OSError as e:
            raise DataError(f"cannot generate data in {cfg.data_dir}: {e}") from None
    splits = load(cfg.data_dir)
    train_set: Dataset = splits.train
    if cfg.data_size is not None:
        if cfg.data_size > len(splits.train):
            raise UsageError(f"--data-size {cfg.data_size} exceeds the {len(splits.train)} "
                             f"training samples in {cfg.data_dir}")
        train_set = Subset(splits.train, range(cfg.data_size))
    return splits, train_set


def average_gradients(model: nn.Module) -> None:
    """The tutorials' hand-written gradient sync: sum over the ranks, then divide."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= size


def state_digest(model: nn.Module) -> str:
    """sha256 over every parameter and buffer: name, dtype, shape, then raw bytes, in order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def _train_epoch(cfg: JobConfig, net: nn.Module, model: nn.Module, loader: DataLoader,
                 optimizer: torch.optim.Optimizer, device: torch.device,
                 epoch: int) -> torch.Tensor:
    """One pass over this rank's shard; returns its (loss sum, correct, samples)."""
    net.train()
    # Sums stay on the device and are read only for a progress line: no sync every step.
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    steps = len(loader)
    for step, (images, labels) in enumerate(loader, 1):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        outputs = net(images)
        loss = F.cross_entropy(outputs, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.sync == "allreduce":
            average_gradients(model)
        optimizer.step()
        with torch.no_grad():
            totals[0] += loss.detach() * len(labels)
            totals[1] += (outputs.argmax(1) == labels).sum()
            totals[2] += len(labels)
        if step % cfg.log_every == 0 or step == steps:
            loss_avg, acc = (totals[:2] / totals[2]).tolist()
            log(cfg, f"epoch {epoch} step {step}/{steps} loss {loss_avg:.4f} acc {acc:.3f}")
    return totals


@torch.no_grad()
def _evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> torch.Tensor:
    """This rank's (loss sum, correct, samples) on its shard of the held-out split."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        outputs = model(images)
        totals[0] += F.cross_entropy(outputs, labels, reduction="sum")
        totals[1] += (outputs.argmax(1) == labels).sum()
        totals[2] += len(labels)
    return totals


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


def _write_json(path: Path, data: dict) -> None:
    _write_atomic(path, lambda p: p.write_text(json.dumps(data, indent=2) + "\n"))


def train(cfg: JobConfig, splits: Splits, train_set: Dataset, device: torch.device,
          threads: int) -> None:
    torch.manual_seed(cfg.seed)
    model = ConvNet().to(device)
    net = _synced(cfg, model, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    sampler = DistributedSampler(train_set, num_replicas=cfg.world_size, rank=cfg.rank,
                                 shuffle=True, seed=cfg.seed)
    loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=sampler,
                        pin_memory=device.type == "cuda")
    # Every held-out sample exactly once over all ranks (DistributedSampler would pad).
    test_shard = Subset(splits.test, range(cfg.rank, len(splits.test), cfg.world_size))
    test_loader = DataLoader(test_shard, batch_size=_EVAL_BATCH)

    history: list[EpochStats] = []
    first = _resume(cfg, model, optimizer, history, device) + 1
    writer = cfg.local_rank == 0 if cfg.local_rank is not None else cfg.rank == 0  # one a host
    seen = 0  # training samples this rank processed
    own_test = None
    for epoch in range(first, cfg.epochs + 1):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        totals = _train_epoch(cfg, net, model, loader, optimizer, device, epoch)
        wall = time.perf_counter() - start
        seen += int(totals[2].item())
        # Running BatchNorm statistics follow each rank's own batches; evaluate, digest and save
        # rank 0's, as DDP itself does at each forward.
        for buffer in model.buffers():
            dist.broadcast(buffer, 0)
        test = _evaluate(model, test_loader, device)
        own_test = test.tolist()
        dist.all_reduce(totals)
        dist.all_reduce(test)
        totals, test = totals.tolist(), test.tolist()
        stats = EpochStats(epoch, wall, int(totals[2]), totals[0] / totals[2],
                           totals[1] / totals[2], test[0] / test[2], test[1] / test[2])
        history.append(stats)
        if cfg.rank == 0:
            log(cfg, f"epoch {epoch}/{cfg.epochs}: train loss {stats.train_loss:.4f} "
                     f"acc {stats.train_acc:.3f}, held-out acc {stats.test_acc:.4f}, "
                     f"{wall:.1f}s, {stats.samples / wall:.0f} samples/s")
        if cfg.checkpoint_dir is not None and writer:
            _save_checkpoint(cfg, epoch, model, optimizer, history)

    if own_test is None:  # resumed after the last epoch: nothing trained, evaluate what was loaded
        own_test = _evaluate(model, test_loader, device).tolist()
    digest = state_digest(model)
    emit(f"params sha256={digest}")
    cfg.out.mkdir(parents=True, exist_ok=True)
    _write_json(cfg.out / f"rank-{cfg.rank}.json", {
        "rank": cfg.rank, "world_size": cfg.world_size, "params_sha256": digest,
        "steps": len(loader) * cfg.epochs, "train_samples": seen,
        "test_correct": int(own_test[1]), "test_samples": int(own_test[2])})
    if cfg.rank == 0:
        _write_outputs(cfg, splits, train_set, model, optimizer, history, digest, threads)
    dist.barrier()


def _synced(cfg: JobConfig, model: nn.Module, device: torch.device) -> nn.Module:
    """What the training steps call: the model in DDP, or (allreduce) the model itself, from rank 0's state."""
    if cfg.sync == "ddp":
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    # DDP starts every rank from rank 0's state; the tutorials' version relies on the seed,
    # which breaks across torch versions, so do what DDP does.
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, 0)
    return model


def _save_checkpoint(cfg: JobConfig, epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                     history: list[EpochStats]) -> None:
    checkpoints.save(cfg.checkpoint_dir, epoch, {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(), "epoch": epoch, "world_size": cfg.world_size,
        "seed": cfg.seed, "history": [asdict(e) for e in history]})


def _resume(cfg: JobConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
            history: list[EpochStats], device: torch.device) -> int:
    """Load the newest epoch checkpoint any rank has (every rank the same one); the epoch it ended."""
    if cfg.checkpoint_dir is None:
        return 0
    epoch, saved = checkpoints.agree(cfg.checkpoint_dir, cfg.rank, cfg.world_size, device)
    if saved is None:
        return 0
    model.load_state_dict({k: v.to(device) for k, v in saved["model"].items()})
    optimizer.load_state_dict(saved["optimizer"])
    history.extend(EpochStats(**e) for e in saved["history"])
    if cfg.rank == 0:
        was = saved.get("world_size")
        change = f"; world size {was} then, {cfg.world_size} now" if was != cfg.world_size else ""
        log(cfg, f"resuming from the epoch {epoch} checkpoint in {cfg.checkpoint_dir}{change}")
    return epoch


def _write_outputs(cfg: JobConfig, splits: Splits, train_set: Dataset, model: nn.Module,
                   optimizer: torch.optim.Optimizer, history: list[EpochStats], digest: str,
                   threads: int) -> None:
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    last = history[-1]
    train_wall = sum(e.wall_s for e in history)
    _write_json(cfg.out / "metrics.json", {
        "world_size": cfg.world_size, "backend": cfg.dist_backend, "init_method": cfg.dist_url,
        "sync": cfg.sync, "batch_size_per_rank": cfg.batch_size,
        "global_batch_size": cfg.batch_size * cfg.world_size, "epochs": cfg.epochs,
        "lr": cfg.lr, "momentum": cfg.momentum, "seed": cfg.seed,
        "data": {"dir": str(cfg.data_dir.resolve()), "source": splits.source,
                 "reader": splits.reader, "train_samples": len(train_set),
                 "test_samples": len(splits.test)},
        "samples_per_s": sum(e.samples for e in history) / train_wall,
        "train_wall_s": train_wall, "epoch_wall_s": [e.wall_s for e in history],
        "final_train_loss": last.train_loss, "final_train_acc": last.train_acc,
        "test_accuracy": last.test_acc, "test_loss": last.test_loss,
        "params_sha256": digest, "threads_per_rank": threads,
        "torch_version": torch.__version__, "epochs_detail": [asdict(e) for e in history]})
    checkpoint = {"model": {k: v.cpu() for k, v in model.state_dict().items()},
                  "optimizer": optimizer.state_dict(), "epoch": cfg.epochs,
                  "params_sha256": digest, "config": config}
    _write_atomic(cfg.out / "checkpoint.pt", lambda p: torch.save(checkpoint, p))
    log(cfg, f"done: held-out acc {last.test_acc:.4f}, train loss {last.train_loss:.4f}; "
             f"wrote {cfg.out / 'metrics.json'} and {cfg.out / 'checkpoint.pt'}")


def run(cfg: JobConfig, environ: Mapping[str, str]) -> None:
    threads = configure_threads(environ)
    device = pick_device(cfg)
    # Before the rendezvous: a rank without data fails at once instead of at the timeout.
    splits, train_set = prepare_data(cfg)
    log(cfg, f"world size {cfg.world_size}, {cfg.dist_backend} via {cfg.dist_url}, "
             f"sync {cfg.sync}, device {device}, {threads} threads")
    log(cfg, f"data: {splits.source} in {cfg.data_dir} ({splits.reader} reader): "
             f"{len(train_set)} of {len(splits.train)} training samples, "
             f"{len(splits.test)} held out")
    init_distributed(cfg, device)
    train(cfg, splits, train_set, device, threads)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    cfg = None
    try:
        cfg = parse_config(argv, os.environ)
        run(cfg, os.environ)
    except (UsageError, DataError, RendezvousError) as e:
        emit(error_line(cfg.rank if cfg else None, str(e)), sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Outputs are written and the group destroyed; what is left is interpreter teardown, where
    # torch 2.13's gloo sometimes aborts ("terminate called without an active exception", no
    # Python frame) on a rank whose peers have already exited, turning a good run into exit 134.
    os._exit(code)
