"""Teardown: from the first rank's failure (and from `clusterrun stop`) to every rank gone.

The job (jobs/crash.py): every rank stamps its start, and the moment a SIGTERM reaches it (then exits
at once). Crash: rank 1 waits until all ranks run, waits 1 s more, stamps `crash` and exits 1;
clusterrun (attached) must stop everyone. Stop: a detached run of sleeping ranks, then
`clusterrun stop RUN --grace 5`.

Figures: ranks gone = the last rank's ended_at in the run record (host clock, corrected by the offset
clusterrun measured; the containers share this machine's clock) minus the crash stamp (or the spawn
of `stop`); TERM delivered = the last term stamp minus the same; controller exit; grace used = the
longest time a rank took from its TERM to its end. After each run the hosts are checked for left
processes (none may be left).
"""

from __future__ import annotations

from ..context import JOBS, Context
from ..measure import Done, run

SECTION = "teardown"
GRACE = 5.0


def run_section(ctx: Context, reps: int) -> None:
    n = ctx.n
    inv = ctx.cluster.write_inventory(ctx.work / "crash.json", root=JOBS, script="crash.py")

    def ended(record: dict) -> dict:
        return {r["rank"]: r["ended_at"] for r in record["ranks"] if r.get("ended_at") is not None}

    def figures(method: str, rep: int, tag: str, t_from: float, done: Done, skip_rank: int) -> None:
        record = ctx.latest_run()
        ends = {r: t for r, t in ended(record).items() if r != skip_rank}
        terms = {r: t for r, t in ctx.stamps(tag, "term").items() if r != skip_rank}
        if len(ends) != n - (1 if skip_rank >= 0 else 0):
            raise RuntimeError(f"teardown/{method}: run {record['id']} has end times for {sorted(ends)} only")
        add = lambda metric, value, unit="s": ctx.rec.add(SECTION, n, method, metric, value, rep, unit)  # noqa
        add("time", max(ends.values()) - t_from)
        add("controller_exit", done.t_end - t_from)
        if terms:
            add("term_delivered", max(terms.values()) - t_from)
            add("grace_used", max(0.0, max(ends[r] - terms[r] for r in terms if r in ends)))
        add("ranks_without_term", len(set(ends) - set(terms)), "ranks")
        left = ctx.check_no_leftovers(SECTION)
        add("left_processes", left, "procs")

    def crash(rep: int) -> None:
        tag = f"{SECTION}-{n}-crash-{rep}"
        done = run(ctx.clusterrun("launch", inv, "--", "--tag", tag, "--crash-rank", "1", "--after", "1.0"),
                   env=ctx.env(), cwd=ctx.cwd, timeout=180)
        if done.codes != [1]:
            raise RuntimeError(f"teardown/crash: clusterrun exited {done.codes} (want 1): {done.describe_failure()}")
        t_crash = ctx.stamp(tag, "crash")
        if t_crash is None:
            raise RuntimeError("teardown/crash: rank 1 did not stamp its crash")
        if rep >= 0:
            figures("crash", rep, tag, t_crash, done, skip_rank=1)

    def stop(rep: int) -> None:
        tag = f"{SECTION}-{n}-stop-{rep}"
        started = run(ctx.clusterrun("launch", "--detach", inv, "--", "--tag", tag), env=ctx.env(), cwd=ctx.cwd,
                      timeout=180)
        if not started.ok:
            raise RuntimeError(f"teardown/stop: launch failed: {started.describe_failure()}")
        run_id = started.outputs[0].decode().split()[-1]
        ctx.wait_stamps(tag, "start", n, timeout=60)
        done = run(ctx.clusterrun("stop", run_id, "--grace", f"{GRACE:g}"), env=ctx.env(), cwd=ctx.cwd,
                   timeout=120)
        if not done.ok:
            raise RuntimeError(f"teardown/stop: stop failed: {done.describe_failure()}")
        if rep >= 0:
            figures("stop", rep, tag, done.t0, done, skip_rank=-1)
            ctx.rec.add(SECTION, n, "stop", "cpu", done.cpu, rep, "cpu-s")

    crash(-1)  # warm-up
    for rep in range(reps):
        for fn in ((crash, stop) if rep % 2 == 0 else (stop, crash)):
            fn(rep)
        ctx.log(f"  teardown rep {rep + 1}/{reps}: " + ", ".join(
            f"{m} {ctx.rec.values(SECTION, n, m, 'time')[-1]:.2f}s" for m in ("crash", "stop")))
    ctx.rec.note(SECTION, n, f"stop: --grace {GRACE:g}; the ranks exit at once on TERM")
