"""A script that wants its rank in its own flags, as pytorch/examples' imagenet/main.py:
--dist-url tcp://ADDR:PORT --rank R --world-size N (a rank per process here)."""

import argparse
import socket

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--dist-url", required=True)
p.add_argument("--dist-backend", default="gloo")
p.add_argument("--rank", type=int, required=True)
p.add_argument("--world-size", type=int, required=True)
p.add_argument("--config", default="{}")
args = p.parse_args()
dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size,
                        rank=args.rank)
t = torch.tensor([1.0])
dist.all_reduce(t)
print(f"imagenet-style rank {args.rank}/{args.world_size} on {socket.gethostname()} url {args.dist_url} "
      f"sum {t.item():.0f} config {args.config}", flush=True)
dist.destroy_process_group()
