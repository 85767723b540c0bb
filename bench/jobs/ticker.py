"""Log-delay benchmark rank: prints `TICK RANK I EPOCH` once a second, flushed at once. Stdlib only."""
import argparse
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int)
    p.add_argument("--ticks", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0)
    a, _ = p.parse_known_args()
    t0 = time.monotonic()
    for i in range(a.ticks):
        sys.stdout.write(f"TICK {a.rank} {i} {time.time():.6f}\n")
        sys.stdout.flush()
        time.sleep(max(0.0, t0 + (i + 1) * a.interval - time.monotonic()))


if __name__ == "__main__":
    main()
