"""Log benchmark rank: prints LINES numbered lines of WIDTH bytes as fast as it can. Stdlib only.

Each line is `RANK SEQ xxx...`, so the bench can check that every line arrived exactly once.
Lines are written a thousand at a time through one buffered writer (the rank is not the bottleneck).
"""
import argparse
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int)
    p.add_argument("--lines", type=int, required=True)
    p.add_argument("--width", type=int, default=80)
    a, _ = p.parse_known_args()
    head = f"{a.rank} "
    pad = "x" * max(1, a.width - len(head) - 10 - 1)
    out = open(sys.stdout.fileno(), "wb", buffering=1 << 20, closefd=False)
    batch = 1000
    for start in range(0, a.lines, batch):
        end = min(a.lines, start + batch)
        out.write("".join(f"{head}{seq:09d} {pad}\n" for seq in range(start, end)).encode())
    out.flush()


if __name__ == "__main__":
    main()
