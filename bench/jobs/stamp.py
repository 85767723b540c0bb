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


def ppid_of(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def cpu_of(pid):
    """CPU seconds a process has used so far: schedstat's nanoseconds where the kernel keeps them, else
    stat's utime + stime in clock ticks."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--sleep", type=float, default=0.5)
    p.add_argument("--shared", default="/shared/bench")
    p.add_argument("--parent-cpu", action="store_true",
                   help="also stamp the CPU so far of the process that started this rank's parent (hostcpu)")
    p.add_argument("--say", action="store_true", help="print one line naming this rank (scale: logs checks it)")
    a, _ = p.parse_known_args()
    if a.say:
        print(f"rank {a.rank} of {a.world_size} says hello", flush=True)
    folder = os.path.join(a.shared, a.tag)
    os.makedirs(folder, exist_ok=True)
    stamp(folder, f"start-{a.rank}", T_START)
    if a.parent_cpu:
        stamp(folder, f"pcpu-{a.rank}", cpu_of(ppid_of(os.getppid())))
    time.sleep(a.sleep)
    stamp(folder, f"end-{a.rank}", time.time())


if __name__ == "__main__":
    main()
