"""Where each host's CPU goes in an attached launch (issue 37): measured, per process, on every host.

The hosts run the bench's own Python wrapper (jobs/cpuwrap.py, named as the hosts' `python` in the
inventory and in the floor's command), which runs what `python ARGS` would and, as each process ends
(os._exit included: the forked supervisor), writes its own CPU (RUSAGE_SELF) and what its interpreter's
start-up had cost by then. So each host's CPU of one launch splits into:
  sshd & shells    the container's cgroup total − every Python process's own (sshd, the login shell)
  host program     per command (`receive`: the held push, which answers, starts and, for an attached
                   launch, follows the logs on its channel; `install`; others), start-up apart; the held
                   push split at the moment the rank runs (the rank reads its parent's parent's CPU from
                   /proc: stamp.py --parent-cpu): answer and start before, follow and the end after
  supervisor       the fork of the start that supervises the ranks
  rank             the job itself (start-up apart)
The floor runs the same job through the same wrapper: its split is sshd & shells and the rank.
Figures are milliseconds per host, medians over repetitions; the wrapper's own cost (a compile of the
bootstrap, runpy) is in the host program's figures.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import defaultdict
from typing import Dict, List

from .. import baselines
from ..cluster import HOST_PYTHON, HOST_SHARED
from ..context import HOST_JOBS, JOBS, Context
from ..measure import Done, run

SECTION = "hostcpu"
METHODS = ("clusterrun", "floor")
WRAPPER = f"{HOST_SHARED}/cpupython"
RECORDS = "cpu-records"
CATEGORIES = ("sshd", "host_startup", "host_receive", "host_push_start", "host_follow", "host_other", "supervisor",
              "rank_startup", "rank", "total")


def install(ctx: Context) -> None:
    shared = ctx.cluster.shared
    shutil.copy(JOBS / "cpuwrap.py", shared / "cpuwrap.py")
    (shared / RECORDS).mkdir(exist_ok=True)
    (shared / RECORDS).chmod(0o777)
    if os.environ.get("HOSTCPU_PROFILE"):  # (it costs CPU itself: for where, not for how much)
        (shared / RECORDS / "profile").touch()
    script = shared / "cpupython"
    script.write_text(f"#!/bin/sh\nexec {HOST_PYTHON} -S {HOST_SHARED}/cpuwrap.py {HOST_SHARED}/{RECORDS} \"$@\"\n")
    script.chmod(0o755)


def collect(ctx: Context) -> List[dict]:
    folder = ctx.cluster.shared / RECORDS
    kept = ctx.state.parent / "hostcpu-profiles"  # beside results.json
    for p in folder.glob("prof-*.pstats"):  # HOSTCPU_PROFILE=1: cProfile of every host program process
        kept.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p), kept / p.name)
    out = []
    for p in folder.glob("*.json"):
        out.append(json.loads(p.read_text()))
        p.unlink()
    return out


def split(records: List[dict]) -> Dict[str, float]:
    """CPU seconds by category over all hosts (sshd: filled in by the caller from the cgroups)."""
    cat: Dict[str, float] = defaultdict(float)
    for r in records:
        argv = r["argv"]
        host_program = len(argv) >= 6 and argv[:2] == ["-S", "-c"]
        if r["forked"]:
            cat["supervisor"] += r["cpu"]
        elif host_program:
            cat["host_startup"] += r["startup"]
            key = "host_receive" if argv[5] == "receive" else "host_other"
            cat[key] += r["cpu"] - r["startup"]
        elif argv[:1] == ["-c"]:  # the installer (first launch only)
            cat["host_other"] += r["cpu"]
        else:
            cat["rank_startup"] += r["startup"]
            cat["rank"] += r["cpu"] - r["startup"]
    return cat


def run_section(ctx: Context, reps: int) -> None:
    n, cl = ctx.n, ctx.cluster
    install(ctx)
    ctx.install_host_jobs()
    inv_path = cl.write_inventory(ctx.work / "hostcpu.json", root=JOBS, script="stamp.py")
    data = json.loads(inv_path.read_text())
    data.setdefault("defaults", {})["python"] = WRAPPER
    inv_path.write_text(json.dumps(data, indent=1) + "\n")
    env = baselines.measured_env()

    def clusterrun(tag: str, versus: bool = False) -> Done:
        return run(ctx.clusterrun("launch", inv_path, "--", "--tag", tag, "--sleep", "0", "--parent-cpu"),
                   env=ctx.env(versus), cwd=ctx.cwd, timeout=300, hosts_cpu=cl.hosts_cpu)

    def floor(tag: str) -> Done:
        line = (f"cd ~/{HOST_JOBS} && {WRAPPER} stamp.py --rank {{rank}} --world-size {n} --tag {tag} --sleep 0")
        return run(baselines.floor(cl, line), env=env, timeout=300, hosts_cpu=cl.hosts_cpu)

    methods = {"clusterrun": clusterrun, "floor": floor, "versus": lambda tag: clusterrun(tag, versus=True)}

    def one(method: str, rep: int) -> None:
        tag = f"{SECTION}-{n}-{method}-{rep if rep >= 0 else 'warmup'}"
        collect(ctx)
        done = methods[method](tag)
        if not done.ok:
            raise RuntimeError(f"{SECTION}/{method} failed: {done.describe_failure()}")
        ctx.wait_stamps(tag, "end", n, timeout=5)
        time.sleep(0.5)  # the supervisors' and followers' last records (they end just after the ranks)
        records = collect(ctx)
        if rep < 0:
            return
        cat = split(records)
        if method != "floor":  # the held push up to the rank's first statement (its parent's parent), then on
            before = sum(ctx.stamps(tag, "pcpu").values()) - cat.get("host_startup", 0.0)
            cat["host_push_start"] = before
            cat["host_follow"] = cat.get("host_receive", 0.0) - before
        cat["total"] = done.hosts_cpu
        cat["sshd"] = done.hosts_cpu - sum(r["cpu"] for r in records)
        ctx.rec.add(SECTION, n, method, "time", done.wall, rep)
        for name in CATEGORIES:
            ctx.rec.add(SECTION, n, method, f"cpu_{name}", 1000 * cat.get(name, 0.0) / n, rep, "ms")

    ctx.interleave(SECTION, ctx.with_versus(METHODS), reps, one)
    ctx.check_no_leftovers(SECTION)
