"""A silent hang for the integration tests: every rank joins a gloo group, then in each step rank
--slow-rank sleeps in slow_loader() before the all_reduce the other ranks already wait in. Each rank
prints, flushed, the time it went in (the last line it writes before the hang).

  --slow-rank R --sleep S    who sleeps, and how long (default 600 s: longer than any test)
  --steps N                  steps (each an all_reduce)
  --hang-attempts K          hang only in attempts 1..K (CLUSTERRUN_ATTEMPT, 1 for the first), then run through
"""

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, required=True)
p.add_argument("--world-size", type=int, required=True)
p.add_argument("--slow-rank", type=int, default=2)
p.add_argument("--sleep", type=float, default=600.0)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--hang-attempts", type=int, default=1)
args = p.parse_args()
attempt = int(os.environ.get("CLUSTERRUN_ATTEMPT", "1"))


def slow_loader():
    time.sleep(args.sleep)


def train_step(t):
    if args.rank == args.slow_rank and attempt <= args.hang_attempts:
        print(f"rank {args.rank} loading at {time.time():.3f}", flush=True)
        slow_loader()
    else:
        print(f"rank {args.rank} in all_reduce at {time.time():.3f}", flush=True)
    dist.all_reduce(t)


dist.init_process_group("gloo", init_method=os.environ["CLUSTERRUN_DIST_URL"], rank=args.rank,
                        world_size=args.world_size, timeout=timedelta(seconds=int(os.environ["CLUSTERRUN_TIMEOUT"])))
for _step in range(args.steps):
    train_step(torch.ones(1))
print(f"rank {args.rank} done", flush=True)
dist.destroy_process_group()
