"""Teardown benchmark rank. Stdlib only.

Every rank stamps its start and, when a SIGTERM arrives, the moment it arrived (then exits at once).
With --crash-rank R, rank R waits until every rank has started, waits --after seconds more, stamps
`crash` and exits 1; the others sleep until they are stopped.
"""
import time

T_START = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402


def stamp(folder, name, value):
    tmp = os.path.join(folder, f".{name}.{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(repr(value))
    os.replace(tmp, os.path.join(folder, name))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--after", type=float, default=1.0)
    p.add_argument("--sleep", type=float, default=120.0)
    p.add_argument("--shared", default="/shared/bench")
    a, _ = p.parse_known_args()
    folder = os.path.join(a.shared, a.tag)
    os.makedirs(folder, exist_ok=True)

    def on_term(signum, frame):
        stamp(folder, f"term-{a.rank}", time.time())
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    stamp(folder, f"start-{a.rank}", T_START)
    if a.rank == a.crash_rank:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                os.path.exists(os.path.join(folder, f"start-{r}")) for r in range(a.world_size)):
            time.sleep(0.01)
        time.sleep(a.after)
        stamp(folder, "crash", time.time())
        sys.exit(1)
    time.sleep(a.sleep)
    stamp(folder, f"end-{a.rank}", time.time())


if __name__ == "__main__":
    main()
