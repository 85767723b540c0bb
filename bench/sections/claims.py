"""Claims: what claiming a host's slots costs a launch, and how soon a waiting launch starts.

Launch cost: `clusterrun launch --detach` of the launch section's job (jobs/stamp.py, already pushed), as
there, with claims on (the default over SSH: every host checks and takes its claim in the push's first
answer, every host's answer meets the others' before any byte is sent, the supervisor adopts the claim)
and with `claims: off`, interleaved; time = the last rank's first-statement stamp minus the spawn.
Hand-over: a run holds every host's only slot (`claims: {slots: 1}`), a second launch waits with
`--wait`; time from the end of `clusterrun stop` of the holder to the waiting run's last rank running.
"""

from __future__ import annotations

import json
import subprocess
import time

from ..context import JOBS, Context
from ..measure import Done, run

SECTION = "claims"
METHODS = ("claims", "no-claims")
JOB_ARGS = ["--sleep", "0.5"]


def _inventory(ctx: Context, name: str, claims) -> str:
    path = ctx.cluster.write_inventory(ctx.work / name, root=JOBS, script="stamp.py")
    data = json.loads(path.read_text())
    data["defaults"]["claims"] = claims
    path.write_text(json.dumps(data, indent=1) + "\n")
    return str(path)


def run_section(ctx: Context, reps: int) -> None:
    n = ctx.n
    invs = {"claims": _inventory(ctx, "claims-on.json", {"slots": 64}),
            "no-claims": _inventory(ctx, "claims-off.json", "off")}

    def one(method: str, rep: int) -> None:
        record = rep >= 0
        tag = f"{SECTION}-{n}-{method}-{rep if record else 'warmup'}"
        done = run(ctx.clusterrun("launch", "--detach", invs[method], "--", "--tag", tag, *JOB_ARGS), env=ctx.env(),
                   cwd=ctx.cwd, timeout=120, hosts_cpu=ctx.cluster.hosts_cpu)
        _check(done, method)
        started = ctx.wait_stamps(tag, "start", n, timeout=60)
        if record:
            ctx.rec.add(SECTION, n, method, "time", max(started.values()) - done.t0, rep)
            ctx.rec.add(SECTION, n, method, "command", done.wall, rep)
            ctx.rec.add(SECTION, n, method, "total_cpu", done.cpu + done.hosts_cpu, rep, "cpu-s")
            push = (ctx.latest_run().get("phases") or {}).get("push")
            if push is not None:
                ctx.rec.add(SECTION, n, method, "phase_push", push, rep)
        ctx.wait_stamps(tag, "end", n, timeout=60)

    ctx.interleave(SECTION, METHODS, reps, one)
    _handover(ctx, reps)
    ctx.check_no_leftovers(SECTION)


def _handover(ctx: Context, reps: int) -> None:
    """A waiting launch starts once the holder is stopped: how long after."""
    n = ctx.n
    inv = _inventory(ctx, "claims-one-slot.json", {"slots": 1})
    for rep in range(reps):
        hold_tag, tag = f"{SECTION}-{n}-hold-{rep}", f"{SECTION}-{n}-handover-{rep}"
        held = run(ctx.clusterrun("launch", "--detach", inv, "--", "--tag", hold_tag, "--sleep", "600"),
                   env=ctx.env(), cwd=ctx.cwd, timeout=120)
        _check(held, "hold")
        run_id = held.outputs[0].decode().split()[-1]
        ctx.wait_stamps(hold_tag, "start", n, timeout=60)
        waiting = subprocess.Popen(ctx.clusterrun("launch", inv, "--wait", "--", "--tag", tag, *JOB_ARGS),
                                   env=ctx.env(), cwd=ctx.cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3.0)  # it stands in line on every host
        stopped = run(ctx.clusterrun("stop", run_id), env=ctx.env(), cwd=ctx.cwd, timeout=120)
        _check(stopped, "stop")
        started = ctx.wait_stamps(tag, "start", n, timeout=60)
        ctx.rec.add(SECTION, n, "handover", "time", max(started.values()) - stopped.t_end, rep)
        if waiting.wait(timeout=120) != 0:
            raise RuntimeError(f"claims/handover: the waiting launch exited {waiting.returncode}")
        ctx.log(f"  claims handover rep {rep + 1}/{reps}: {ctx.rec.values(SECTION, n, 'handover', 'time')[-1]:.2f}s")


def _check(done: Done, method: str) -> None:
    if not done.ok:
        raise RuntimeError(f"claims/{method} failed: {done.describe_failure()}")
