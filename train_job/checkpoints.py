"""Epoch checkpoints: saved atomically after every epoch, resumed from the newest one any rank finds.

The folder may be per host (clusterrun's CLUSTERRUN_CHECKPOINT_DIR) or shared. One rank per host
(LOCAL_RANK 0, or every rank when no launcher says) writes ``epoch-<E>.pt``; the two newest are kept.
At the start the ranks agree on the newest epoch any of them has (all_reduce MAX), the lowest rank
holding it loads the file and broadcasts it, so a host that joined without checkpoints (or a new
rank 0 after a restart on fewer hosts) resumes too. World size may differ from the saving run's:
model and optimizer state do not depend on it, and the sampler re-shards the next epoch.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

_NAME = re.compile(r"epoch-(\d+)\.pt")
KEEP = 2


def newest(folder: Path | None) -> tuple[int, Path | None]:
    """The highest epoch saved in folder (0 and None when none or no folder)."""
    if folder is None or not folder.is_dir():
        return 0, None
    found = [(int(m[1]), folder / name) for name in os.listdir(folder) if (m := _NAME.fullmatch(name))]
    return max(found, default=(0, None))


def agree(folder: Path | None, rank: int, world_size: int, device: torch.device) -> tuple[int, dict | None]:
    """The epoch every rank resumes after (0: from scratch) and its state, the same on every rank."""
    epoch, path = newest(folder)
    best = torch.tensor([epoch], dtype=torch.int64, device=device)
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    target = int(best.item())
    if target == 0:
        return 0, None
    holder = torch.tensor([rank if epoch == target else world_size], dtype=torch.int64, device=device)
    dist.all_reduce(holder, op=dist.ReduceOp.MIN)
    src = int(holder.item())
    box: list[Any] = [torch.load(path, map_location="cpu", weights_only=False) if rank == src else None]
    dist.broadcast_object_list(box, src=src, device=device if device.type == "cuda" else None)
    return target, box[0]


def save(folder: Path, epoch: int, state: dict) -> Path:
    """epoch-<E>.pt, written to a temporary name and renamed (a crash mid-write leaves no half file);
    older ones beyond the newest KEEP removed."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch-{epoch}.pt"
    tmp = folder / f".epoch-{epoch}.pt.{socket.gethostname()}.{os.getpid()}.tmp"
    torch.save(state, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    old = sorted((int(m[1]) for name in os.listdir(folder) if (m := _NAME.fullmatch(name))), reverse=True)
    for e in old[KEEP:]:
        try:
            (folder / f"epoch-{e}.pt").unlink()
        except FileNotFoundError:
            pass  # another rank sharing the folder removed it first
    return path
