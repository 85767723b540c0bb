"""stacks: `clusterrun stacks RUN` on a detached run of N hosts whose last rank sleeps in slow_loader()
while the others wait (bench/jobs/stall.py): the whole command as a user runs it (a new process: its
start-up, the registry, SSH to every host, the host program there signalling the rank and reading its
dump, the folding), from spawn to exit. Beside it, interleaved: the floor of starting anything on every
host (paramiko, a thread per host, connect + `true`) and pdsh running `true`. Each answer is checked: the
first line names the odd rank and slow_loader, and every rank is read.
"""

from __future__ import annotations

import os

from .. import baselines
from ..context import JOBS, Context
from ..measure import run

SECTION = "stacks"
METHODS = ("clusterrun stacks", "floor", "pdsh")


def run_section(ctx: Context, reps: int) -> None:
    n, cl = ctx.n, ctx.cluster
    tag = f"stacks-{n}"
    inv = cl.write_inventory(ctx.work / "stacks.json", root=JOBS, script="stall.py", args=["--tag", tag],
                             grace="2s")
    launched = run(ctx.clusterrun("launch", "--detach", inv), env=ctx.env(), cwd=ctx.cwd, timeout=300)
    if not launched.ok:
        raise RuntimeError(f"stacks: launch failed: {launched.describe_failure()}")
    run_id = ctx.latest_run()["id"]
    try:
        ctx.wait_stamps(tag, "ready", n, timeout=120)
        _measure(ctx, reps, run_id)
    finally:
        run(ctx.clusterrun("stop", run_id, "--grace", "1"), env=ctx.env(), cwd=ctx.cwd, timeout=120)


def _measure(ctx: Context, reps: int, run_id: str) -> None:
    n, cl = ctx.n, ctx.cluster
    pdsh, pdsh_env = baselines.pdsh_command(cl, "true")
    argvs = {"clusterrun stacks": (ctx.clusterrun("stacks", run_id), dict(env=ctx.env(), cwd=ctx.cwd)),
             "floor": (baselines.floor(cl), {}),
             "pdsh": (pdsh, dict(env=dict(os.environ, **pdsh_env)))}

    def one(method: str, rep: int) -> None:
        argv, kw = argvs[method]
        done = run(argv, timeout=120, **kw)
        if not done.ok:
            raise RuntimeError(f"stacks/{method} failed: {done.describe_failure()}")
        if method == "clusterrun stacks":
            _check(done.outputs[0].decode(), n)
        if rep >= 0:
            ctx.rec.add(SECTION, n, method, "time", done.wall, rep)
            ctx.rec.add(SECTION, n, method, "cpu", done.cpu, rep, "cpu-s")

    ctx.interleave(SECTION, METHODS, reps, one)


def _check(text: str, n: int) -> None:
    lines = text.splitlines()
    if not lines or not lines[0].startswith(f"rank {n - 1} (1 of {n})") or "slow_loader" not in lines[0]:
        raise RuntimeError(f"stacks: the first line does not name rank {n - 1} in slow_loader: {lines[:2]}")
    if f"ranks 0-{n - 2} ({n - 1} of {n})" not in text:
        raise RuntimeError(f"stacks: the other ranks are not one group: {lines[:12]}")
