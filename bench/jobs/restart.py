"""Restart benchmark rank (needs torch): from a failure to the new attempt's first training step.

Every rank joins a gloo group, then steps (an all_reduce every --step-time seconds). After its first step
every process stamps `step-<pid*10000+rank>` (a restarted rank is a new process). Rank --crash-rank, the first time
(no `crash` stamp yet), waits until every rank stepped, waits --after seconds more, stamps `crash` and
SIGKILLs itself (--mode kill); with --mode host it only stamps `ready` and the benchmark kills its host.
(torchrun's agents do not agree on TORCHELASTIC_RESTART_COUNT: only the agent whose worker failed counts
a restart, so the stamps do not rely on it.)
"""
import argparse
import os
import signal
import socket
import time


def stamp(folder, name, value):
    tmp = os.path.join(folder, f".{name}.{socket.gethostname()}.{os.getpid()}")  # pids repeat across hosts
    with open(tmp, "w") as fh:
        fh.write(repr(value))
    os.replace(tmp, os.path.join(folder, name))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tag", required=True)
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--after", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--mode", choices=("kill", "host"), default="kill")
    p.add_argument("--shared", default="/shared/bench")
    a, _ = p.parse_known_args()
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    folder = os.path.join(a.shared, a.tag)
    os.makedirs(folder, exist_ok=True)
    dist.init_process_group("gloo")
    t = torch.ones(1)
    for step in range(a.steps):
        dist.all_reduce(t)
        if step == 0:
            stamp(folder, f"step-{os.getpid() * 10000 + rank}", time.time())
            stamp(folder, f"up-{rank}", time.time())
            done = os.path.exists(os.path.join(folder, "crash")) or os.path.exists(os.path.join(folder, "ready"))
            if rank == a.crash_rank and not done:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and not all(
                        os.path.exists(os.path.join(folder, f"up-{r}")) for r in range(world)):
                    time.sleep(0.01)
                time.sleep(a.after)
                if a.mode == "kill":
                    stamp(folder, "crash", time.time())
                    os.kill(os.getpid(), signal.SIGKILL)
                stamp(folder, "ready", time.time())
        time.sleep(a.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
