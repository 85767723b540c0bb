"""Stacks benchmark rank: stamps that it is in place, then the last rank sleeps in slow_loader() while
the others wait for it (a silent hang, as `clusterrun stacks` meets one). Stdlib only."""
import argparse
import os
import time


def slow_loader(seconds):
    time.sleep(seconds)


def wait_for_peers(seconds):
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(0.05)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--shared", default="/shared/bench")
    a, _ = p.parse_known_args()
    folder = os.path.join(a.shared, a.tag)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, ".ready-%d" % a.rank)
    with open(tmp, "w") as fh:
        fh.write(repr(time.time()))
    os.replace(tmp, os.path.join(folder, "ready-%d" % a.rank))
    if a.rank == a.world_size - 1:
        slow_loader(a.seconds)
    wait_for_peers(a.seconds)


if __name__ == "__main__":
    main()
