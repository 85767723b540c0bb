"""Launch: from the command to every rank running (a trivial job whose code is already on the hosts).

Each rank's first statement stamps time.time() under /shared; launch time = the last rank's stamp
minus the moment just before the command was spawned (the containers share this machine's clock).
Methods: clusterrun --detach; the floor (paramiko connect + `true` on every host, a thread each); the
fair floor (the same paramiko fan-out starting the job's Python on every host, timed like clusterrun to
the last rank's first statement); a serial `ssh host 'nohup python ... &'` loop; one pdsh fan-out.
CPU: the controller's (the command and its children) and the hosts' (every process in their containers).
"""

from __future__ import annotations

import json
import os

from .. import baselines
from ..context import HOST_JOBS, JOBS, Context
from ..measure import Done, run

SECTION = "launch"
METHODS = ("clusterrun", "floor", "floor-job", "ssh-serial", "pdsh")
JOB_ARGS = ["--sleep", "0.5"]


def run_section(ctx: Context, reps: int) -> None:
    n = ctx.n
    inv = ctx.cluster.write_inventory(ctx.work / "launch.json", root=JOBS, script="stamp.py")
    serial = ctx.work / "serial-launch.sh"
    ctx.install_host_jobs()

    cl = ctx.cluster

    def clusterrun(tag: str) -> Done:
        return run(ctx.clusterrun("launch", "--detach", inv, "--", "--tag", tag, *JOB_ARGS), env=ctx.env(),
                   cwd=ctx.cwd, timeout=120, hosts_cpu=cl.hosts_cpu)

    def floor_job(tag: str) -> Done:
        return run(baselines.floor_job(cl, "stamp.py", ["--tag", tag, *JOB_ARGS], f"~/{HOST_JOBS}"), timeout=120,
                   hosts_cpu=cl.hosts_cpu)

    def ssh_serial(tag: str) -> Done:
        serial.write_text(baselines.serial_ssh_script(ctx.cluster, "stamp.py", ["--tag", tag, *JOB_ARGS],
                                                      f"~/{HOST_JOBS}"))
        return run(["bash", str(serial)], timeout=300, hosts_cpu=cl.hosts_cpu)

    def pdsh(tag: str) -> Done:
        argv, env = baselines.pdsh(ctx.cluster, "stamp.py", ["--tag", tag, *JOB_ARGS], f"~/{HOST_JOBS}")
        return run(argv, env=dict(os.environ, **env), timeout=300, hosts_cpu=cl.hosts_cpu)

    starters = {"clusterrun": clusterrun, "floor-job": floor_job, "ssh-serial": ssh_serial, "pdsh": pdsh}

    def one(method: str, rep: int) -> None:
        record = rep >= 0
        tag = f"{SECTION}-{n}-{method}-{rep if record else 'warmup'}"
        if method == "floor":
            done = run(baselines.floor(ctx.cluster), timeout=120)
            _check(done, method)
            if record:
                inner = json.loads(done.outputs[0])["inner_s"]
                ctx.rec.add(SECTION, n, method, "time", done.wall, rep)
                ctx.rec.add(SECTION, n, method, "inner", inner, rep)
                ctx.rec.add(SECTION, n, method, "cpu", done.cpu, rep, "cpu-s")
            return
        done = starters[method](tag)
        _check(done, method)
        started = ctx.wait_stamps(tag, "start", n, timeout=60)
        if record:
            ctx.rec.add(SECTION, n, method, "time", max(started.values()) - done.t0, rep)
            ctx.rec.add(SECTION, n, method, "command", done.wall, rep)
            ctx.rec.add(SECTION, n, method, "cpu", done.cpu, rep, "cpu-s")
            ctx.rec.add(SECTION, n, method, "hosts_cpu", done.hosts_cpu, rep, "cpu-s")
            ctx.rec.add(SECTION, n, method, "total_cpu", done.cpu + done.hosts_cpu, rep, "cpu-s")
            if method == "clusterrun":
                phases = ctx.latest_run().get("phases") or {}
                for phase in ("connect", "push", "start"):
                    if phase in phases:
                        ctx.rec.add(SECTION, n, method, f"phase_{phase}", phases[phase], rep)
        ctx.wait_stamps(tag, "end", n, timeout=60)  # every rank gone before the next method

    ctx.interleave(SECTION, METHODS, reps, one)
    ctx.check_no_leftovers(SECTION)


def _check(done: Done, method: str) -> None:
    if not done.ok:
        raise RuntimeError(f"launch/{method} failed: {done.describe_failure()}")
