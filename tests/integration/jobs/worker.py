"""A small job for the integration tests: joins a gloo group, then steps with a barrier each step
(so the other ranks block in a collective, as real training does, when one rank dies).

  --steps N --step-time S     how long it runs
  --crash-rank R --crash-at K --crash-mode exit|segv|kill    rank R dies at step K
  --print-pid DIR             write DIR/pid-<host>-<rank> (tests check these processes are gone)
  --no-dist                   skip torch.distributed (a plain process)
"""

import argparse
import os
import signal
import socket
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, required=True)
p.add_argument("--world-size", type=int, required=True)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--step-time", type=float, default=0.2)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--crash-mode", default="exit", choices=["exit", "segv", "kill"])
p.add_argument("--no-dist", action="store_true")
args = p.parse_args()

print(f"worker rank {args.rank}/{args.world_size} on {socket.gethostname()} pid {os.getpid()}", flush=True)
dist = None
if not args.no_dist:
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=os.environ["CLUSTERRUN_DIST_URL"], rank=args.rank,
                            world_size=args.world_size,
                            timeout=timedelta(seconds=int(os.environ["CLUSTERRUN_TIMEOUT"])))
    print(f"rank {args.rank} joined the group", flush=True)
for step in range(args.steps):
    if args.rank == args.crash_rank and step == args.crash_at:
        print(f"rank {args.rank} crashing at step {step} ({args.crash_mode})", flush=True)
        if args.crash_mode == "exit":
            sys.exit(7)
        os.kill(os.getpid(), signal.SIGSEGV if args.crash_mode == "segv" else signal.SIGKILL)
    print(f"rank {args.rank} step {step}", flush=True)
    time.sleep(args.step_time)
    if dist is not None:
        dist.barrier()
print(f"rank {args.rank} finished", flush=True)
