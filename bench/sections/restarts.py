"""restarts: from a failure to the new attempt's first training step (job.restarts).

The job (jobs/restart.py, torch + gloo): every rank process stamps the time of its first step; the
first time, rank 1 stamps `crash` and SIGKILLs itself one second after every rank stepped.
Methods, side by side on the same hosts and job:
  clusterrun      launcher python, job.restarts 1, restart_delay 0: clusterrun stops every rank and starts
                  attempt 2 on the same hosts (new port, same folders);
  torchrun        launcher torchrun, job.restarts 1 (its --max-restarts): torchrun's own agents restart
                  their workers after a new rendezvous. The floor: what torch itself needs.
  clusterrun-host the last host is killed (`docker kill`, a power cut) instead; job.min_nodes N-1, so
                  attempt 2 runs on the others (host_lost 5 s). torchrun has no counterpart: its workers
                  wait on the dead host's peers until a collective times out.
Figure: the last first-step stamp after the crash minus the `crash` stamp (or the moment of the kill), all on this
machine's clock (the containers share it).
"""

from __future__ import annotations

import json
import time

from ..context import JOBS, Context
from ..measure import run

SECTION = "restarts"
METHODS = ("clusterrun", "torchrun", "clusterrun-host")
HOST_LOST = 5.0


def run_section(ctx: Context, reps: int) -> None:
    n, cl = ctx.n, ctx.cluster

    def inventory(method: str):
        path = cl.write_inventory(ctx.work / f"restart-{method}.json", root=JOBS, script="restart.py", grace="2s")
        data = json.loads(path.read_text())
        data["job"].update({"restarts": 1, "restart_delay": "0s", "timeout": "60s"})
        if method == "torchrun":
            data["job"]["launcher"] = "torchrun"
        if method == "clusterrun-host":
            data["job"]["min_nodes"] = n - 1
            data["timeouts"].update({"host_lost": f"{HOST_LOST:g}s", "connect": "3s"})
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    invs = {m: inventory(m) for m in METHODS}

    def one(method: str, rep: int) -> None:
        tag = f"{SECTION}-{n}-{method}-{rep}"
        argv = ctx.clusterrun("launch", invs[method], "--", "--tag", tag,
                              *(["--mode", "host", "--crash-rank", str(n - 1)] if method == "clusterrun-host" else []))
        if method != "clusterrun-host":
            done = run(argv, env=ctx.env(), cwd=ctx.cwd, timeout=300)
            t_fail = ctx.stamp(tag, "crash")
            if not done.ok:
                raise RuntimeError(f"restarts/{method} failed: {done.describe_failure()}")
        else:
            t_fail = _lose_last_host(ctx, argv, tag, method)
        firsts = {k: t for k, t in ctx.stamps(tag, "step").items() if t_fail is not None and t > t_fail}
        want = n - 1 if method == "clusterrun-host" else n
        if t_fail is None or len(firsts) != want:
            raise RuntimeError(f"restarts/{method}: crash stamp {t_fail}, {len(firsts)} of {want} ranks stepped "
                               "in attempt 2")
        if rep >= 0:
            ctx.rec.add(SECTION, n, method, "time", max(firsts.values()) - t_fail, rep)
        ctx.check_no_leftovers(SECTION)

    ctx.interleave(SECTION, METHODS, reps, one)
    ctx.rec.note(SECTION, n, f"grace 2 s (the ranks exit at once on TERM), restart_delay 0, host_lost {HOST_LOST:g} s")


def _lose_last_host(ctx: Context, argv, tag: str, method: str) -> float:
    """Run argv and kill the last host once the job stamped `ready`; the moment of the kill."""
    import subprocess

    cl = ctx.cluster
    proc = subprocess.Popen(argv, env=ctx.env(), cwd=ctx.cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while ctx.stamp(tag, "ready") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        cl.c.crash(cl.names[-1])
        t_fail = time.time()
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        cl.c.start(cl.names[-1])
    if code != 0:
        raise RuntimeError(f"restarts/{method}: clusterrun exited {code}")
    return t_fail
