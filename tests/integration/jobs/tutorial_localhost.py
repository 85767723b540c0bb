"""The DDP tutorial's setup, kept when moving to several machines: MASTER_ADDR set to localhost in the
script itself, so every rank off rank 0's host connects to its own host."""

import datetime
import os

import torch.distributed as dist


def main():
    os.environ["MASTER_ADDR"] = "localhost"  # the tutorial's line
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=float(os.environ.get("LAB_TIMEOUT", "30"))))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
