"""A lab's script as published: each process takes its rank from a counter file on the shared folder
(read it, write it plus one, wrap at the world size) instead of --rank, its data sits at a fixed absolute
path on the share, and the tcp:// address is an argument. Correct only when the processes start in rank
order (by hand: one machine after another)."""

import argparse
import fcntl
import os
import socket
import time

SHARE = "/shared/lab"  # fixed, as such scripts have it
COUNTER = os.path.join(SHARE, "rank_counter")
DATA = os.path.join(SHARE, "data.txt")


def take_rank(world_size):
    with open(COUNTER, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read().strip()
        rank = int(text) if text else 0
        fh.seek(0)
        fh.truncate()
        fh.write(str((rank + 1) % world_size))
    return rank


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    time.sleep(float(os.environ.get("LAB_SLOW_START", "0")))  # the test's way to make one machine late
    rank = take_rank(args.world_size)  # before the heavy imports: this is what the by-hand order protects
    print("took rank %d of %d on %s" % (rank, args.world_size, socket.gethostname()), flush=True)

    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=args.init_method, rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.timeout))
    with open(DATA) as fh:
        values = [float(x) for x in fh.read().split()]
    t = torch.tensor([values[rank]])
    dist.all_reduce(t)
    print("rank %d on %s sum %g" % (rank, socket.gethostname(), t.item()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
