"""Real rank processes for the example job's tests: environments, ports, start, wait, kill."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "train_job" / "train.py"

# What a launcher may have left in this shell; every rank gets only what its test gives it.
_LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID"}
_RENDEZVOUS_LINE = re.compile(r"^\[rank \d+\] world size ", re.M)


@dataclass(frozen=True)
class RankRun:
    returncode: int
    stdout: str
    stderr: str
    # Seconds from the job's line just before init_distributed to its exit; None if not seen.
    after_rendezvous_start_s: float | None

    def describe(self) -> str:
        return (f"exit {self.returncode}\n--- stdout (tail)\n{self.stdout[-2000:]}"
                f"\n--- stderr (tail)\n{self.stderr[-3000:]}")


def job_env(**extra: str) -> dict[str, str]:
    """This environment without launcher variables, one thread per rank (two ranks, two cores)."""
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_VARS and not k.startswith("CLUSTERRUN_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, str(TRAIN), *args]


def run_ranks(specs: list[tuple[list[str], dict[str, str]]], cwd: Path,
              timeout: float = 90.0) -> list[RankRun]:
    """Start every (argv, env) at once, each in its own process group, and wait for all.

    Output goes to files, not pipes, so that no rank blocks on a full pipe while the test
    waits on another. Whatever is still running at the end is killed by its process group.
    """
    logs = cwd / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    try:
        for i, (argv, env) in enumerate(specs):
            out, err = open(logs / f"{i}.out", "w+"), open(logs / f"{i}.err", "w+")
            files += [out, err]
            procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        rendezvous_at: list[float | None] = [None] * len(procs)
        ended_at: list[float | None] = [None] * len(procs)
        deadline = time.monotonic() + timeout
        while None in ended_at and time.monotonic() < deadline:
            now = time.monotonic()
            for i, proc in enumerate(procs):
                if rendezvous_at[i] is None and _RENDEZVOUS_LINE.search(
                        (logs / f"{i}.out").read_text()):
                    rendezvous_at[i] = now
                if ended_at[i] is None and proc.poll() is not None:
                    ended_at[i] = now
            time.sleep(0.05)
        results = [
            RankRun(proc.returncode if ended_at[i] is not None else -1,
                    (logs / f"{i}.out").read_text(), (logs / f"{i}.err").read_text(),
                    None if rendezvous_at[i] is None or ended_at[i] is None
                    else ended_at[i] - rendezvous_at[i])
            for i, proc in enumerate(procs)]
    finally:
        # By the group each was started in: torchrun's workers too, even if the agent is gone.
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for f in files:
            f.close()
    if None in ended_at:
        pytest.fail(f"ranks still running after {timeout}s:\n" +
                    "\n".join(r.describe() for r in results))
    return results
