"""exec: one command on every host, from the command to every host's answer printed.

Methods: `clusterrun exec` (its own SSH engine: paramiko with TCP_NODELAY, AES-GCM preferred, keys
loaded once); fabric's ThreadingGroup (bench/fabric_exec.py, configured to check host keys as strictly);
pdsh. Each is a whole process, as a user runs it; wall time and CPU (this process and its children).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import baselines
from ..context import JOBS, Context
from ..measure import run

SECTION = "exec"
METHODS = ("clusterrun", "fabric", "pdsh")
COMMAND = ["hostname"]
FABRIC = Path(__file__).resolve().parents[1] / "fabric_exec.py"


def run_section(ctx: Context, reps: int) -> None:
    n, cl = ctx.n, ctx.cluster
    inv = cl.write_inventory(ctx.work / "exec.json", root=JOBS, script="stamp.py")
    argvs = {
        "clusterrun": (ctx.clusterrun("exec", inv, "--", *COMMAND), dict(env=ctx.env(), cwd=ctx.cwd)),
        "fabric": ([sys.executable, str(FABRIC), "--hosts", ",".join(cl.addresses), "--user", cl.user,
                    "--key", cl.key, "--known-hosts", cl.known_hosts, "--", *COMMAND], {}),
        "pdsh": (baselines.pdsh_command(cl, " ".join(COMMAND))[0],
                 dict(env=dict(os.environ, **baselines.pdsh_command(cl, " ".join(COMMAND))[1]))),
    }

    def one(method: str, rep: int) -> None:
        argv, kw = argvs[method]
        done = run(argv, timeout=120, **kw)
        if not done.ok:
            raise RuntimeError(f"exec/{method} failed: {done.describe_failure()}")
        answered = sum(1 for line in done.outputs[0].decode().splitlines() if "node" in line)
        if method != "clusterrun" and answered != n:
            raise RuntimeError(f"exec/{method}: {answered} of {n} hosts answered")
        if rep >= 0:
            ctx.rec.add(SECTION, n, method, "time", done.wall, rep)
            ctx.rec.add(SECTION, n, method, "cpu", done.cpu, rep, "cpu-s")

    ctx.interleave(SECTION, METHODS, reps, one)
