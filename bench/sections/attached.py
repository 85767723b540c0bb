"""Attached launch (issue 26): from the command to its end, for a job that exits at once.

What a user waits for when a launch is attached: connect, push (unchanged here: nothing to send), start,
the job (it stamps the moment each rank runs and exits), the ranks' ends seen, the process gone. Each
method runs the same job (`jobs/stamp.py --sleep 0`) on every host and waits for all of it:
  clusterrun   `clusterrun launch INV` (attached)
  floor        the whole-process floor: a fresh Python that imports paramiko, connects to every host in
               threads, runs the job and waits for its exit (paramiko_tools.py floor --command JOB); what
               any Python launcher must at least do. Its own "inner" time (after its imports) is the
               in-process floor
  ssh-serial   `ssh host 'cd ...; python stamp.py --rank i ...'` for one host after the other (the tutorials)
  pdsh         one `pdsh -R ssh` fan-out, each host taking its rank from its name
Figures per method: wall time (spawn → exit), controller CPU (the command and its children), hosts CPU
(every process in the hosts' containers: sshd, the host program, the ranks), their sum; the last rank's
start stamp − spawn ("start"), and the exit − the last rank's end stamp ("tail": what comes after the
job). clusterrun's phases (connect, push, start, run) from its record.
"""

from __future__ import annotations

import json
import shlex

from .. import baselines
from ..cluster import HOST_PYTHON
from ..context import HOST_JOBS, JOBS, Context
from ..measure import Done, run

SECTION = "attached"
METHODS = ("clusterrun", "floor", "ssh-serial", "pdsh")
JOB_ARGS = ["--sleep", "0"]


def job_line(ctx: Context, rank: str, tag: str) -> str:
    """What a host runs in the baselines: the job in the foreground (they wait for it)."""
    return (f"cd ~/{HOST_JOBS} && {HOST_PYTHON} stamp.py --rank {rank} --world-size {ctx.n} "
            f"{shlex.join(['--tag', tag, *JOB_ARGS])}")


def run_section(ctx: Context, reps: int) -> None:
    n, cl = ctx.n, ctx.cluster
    inv = cl.write_inventory(ctx.work / "attached.json", root=JOBS, script="stamp.py")
    serial = ctx.work / "serial-attached.sh"
    ctx.install_host_jobs()
    env = baselines.measured_env()

    def clusterrun(tag: str, versus: bool = False) -> Done:
        return run(ctx.clusterrun("launch", inv, "--", "--tag", tag, *JOB_ARGS), env=ctx.env(versus), cwd=ctx.cwd,
                   timeout=300, hosts_cpu=cl.hosts_cpu)

    def floor(tag: str) -> Done:
        return run(baselines.floor(cl, job_line(ctx, "{rank}", tag)), env=env, timeout=300, hosts_cpu=cl.hosts_cpu)

    def ssh_serial(tag: str) -> Done:
        lines = ["#!/bin/bash", "set -e"] + [shlex.join(cl.ssh_argv(i, job_line(ctx, str(i), tag))) for i in range(n)]
        serial.write_text("\n".join(lines) + "\n")
        return run(["bash", str(serial)], env=env, timeout=600, hosts_cpu=cl.hosts_cpu)

    def pdsh(tag: str) -> Done:
        argv, extra = baselines.pdsh_command(cl, "r=$(hostname); r=${r#node}; " + job_line(ctx, "$r", tag))
        return run(argv, env=dict(env, **extra), timeout=600, hosts_cpu=cl.hosts_cpu)

    methods = {"clusterrun": clusterrun, "floor": floor, "ssh-serial": ssh_serial, "pdsh": pdsh,
               "versus": lambda tag: clusterrun(tag, versus=True)}

    def one(method: str, rep: int) -> None:
        record = rep >= 0
        tag = f"{SECTION}-{n}-{method}-{rep if record else 'warmup'}"
        done = methods[method](tag)
        if not done.ok:
            raise RuntimeError(f"{SECTION}/{method} failed: {done.describe_failure()}")
        started = ctx.wait_stamps(tag, "start", n, timeout=5)
        ended = ctx.wait_stamps(tag, "end", n, timeout=5)
        if not record:
            return
        add = lambda metric, value, unit="s": ctx.rec.add(SECTION, n, method, metric, value, rep, unit)  # noqa: E731
        add("time", done.wall)
        add("start", max(started.values()) - done.t0)
        add("tail", done.t_end - max(ended.values()))
        add("cpu", done.cpu, "cpu-s")
        add("hosts_cpu", done.hosts_cpu, "cpu-s")
        add("total_cpu", done.cpu + done.hosts_cpu, "cpu-s")
        if method == "floor":
            add("inner", float(json.loads(done.outputs[0])["inner_s"]))
        if method in ("clusterrun", "versus"):
            phases = ctx.latest_run().get("phases") or {}
            for phase in ("connect", "push", "start"):
                if phase in phases:
                    add(f"phase_{phase}", phases[phase])

    ctx.interleave(SECTION, ctx.with_versus(METHODS), reps, one)
    ctx.check_no_leftovers(SECTION)
