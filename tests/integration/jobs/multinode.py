"""A script written for torchrun, like pytorch/examples' ddp-tutorial-series/multinode.py (CPU, gloo):
strict argparse with positional arguments, the rank only from the environment.

  FAIL_RANK=R        rank R raises at its first step (every time)
  FAIL_ONCE_RANK=R   rank R raises the first time only (a marker file in the job folder remembers)
  SLEEP=S            each rank sleeps S seconds after joining (to be stopped meanwhile)
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser(description="simple distributed training job")
p.add_argument("total_epochs", type=int)
p.add_argument("save_every", type=int)
p.add_argument("--batch_size", default=32, type=int)
args = p.parse_args()

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}/{world} local {os.environ['LOCAL_RANK']} on {socket.gethostname()} "
      f"restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '-')}", flush=True)
if os.environ.get("FAIL_RANK") == str(rank):
    raise RuntimeError(f"rank {rank} fails on purpose")
marker = f"failed-once-rank-{rank}"
if os.environ.get("FAIL_ONCE_RANK") == str(rank) and not os.path.exists(marker):
    open(marker, "w").close()
    print(f"rank {rank} failing once", flush=True)
    raise RuntimeError(f"rank {rank} fails once")
time.sleep(float(os.environ.get("SLEEP", "0")))
total = torch.tensor([float(rank + 1)])
for epoch in range(args.total_epochs):
    dist.all_reduce(total)
    print(f"rank {rank} epoch {epoch} batch {args.batch_size} sum {total.item():.0f}", flush=True)
    total = torch.tensor([float(rank + 1)])
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
