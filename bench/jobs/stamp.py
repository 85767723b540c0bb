"""Launch benchmark rank: stamps the moment it runs, sleeps briefly, stamps its end. Stdlib only."""
import time

T_START = time.time()  # the first statement: this rank is running

import argparse  # noqa: E402
import os  # noqa: E402


def stamp(folder, name, value):
    """Atomic, so the bench never reads half a number."""
    tmp = os.path.join(folder, f".{name}.{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(repr(value))
    os.replace(tmp, os.path.join(folder, name))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--sleep", type=float, default=0.5)
    p.add_argument("--shared", default="/shared/bench")
    a, _ = p.parse_known_args()
    folder = os.path.join(a.shared, a.tag)
    os.makedirs(folder, exist_ok=True)
    stamp(folder, f"start-{a.rank}", T_START)
    time.sleep(a.sleep)
    stamp(folder, f"end-{a.rank}", time.time())


if __name__ == "__main__":
    main()
