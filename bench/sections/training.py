"""Training: samples/s of the example job under clusterrun versus the same command started by hand.

The job: train_job/train.py --epochs 2 --synthetic --data-dir data --data-size 10000, one rank per
host, gloo. (With --epochs 1 --data-size 2000 the timed part is one 0.5 s epoch, and run-to-run noise
on this machine is ±50%: the figure would measure noise. 2 x 10,000 samples take ~5 s.)
By hand = what a tutorial has you do: the code copied to every host once, then in parallel
`ssh host 'cd ...; RANK=i WORLD_SIZE=n MASTER_ADDR=... python train.py --rank i ...'`.
Both read samples/s from rank 0's out/metrics.json. Run at 4 hosts only: more ranks than cores
measures the CPU scheduler, not the launcher.
"""

from __future__ import annotations

import json
import shutil

from .. import baselines
from ..cluster import REPO
from ..context import Context
from ..measure import Done, rotate, run, run_parallel

SECTION = "training"
METHODS = ("clusterrun", "by-hand")
ARGS = ["--epochs", "2", "--synthetic", "--data-dir", "data", "--data-size", "10000"]
HOST_DIR = "benchtrain"


def run_section(ctx: Context, reps: int) -> None:
    n, cl = ctx.n, ctx.cluster
    inv = cl.write_inventory(ctx.work / "train.json", root=REPO, script="train_job/train.py", args=ARGS,
                             sync=["train_job/"])
    shared = cl.shared / "benchtrain"
    shutil.rmtree(shared, ignore_errors=True)
    shutil.copytree(REPO / "train_job", shared / "train_job", ignore=shutil.ignore_patterns("__pycache__"))
    cl.on_all(f"rm -rf ~/{HOST_DIR} && mkdir -p ~/{HOST_DIR} && cp -r /shared/benchtrain/train_job ~/{HOST_DIR}/")

    def clusterrun() -> tuple:
        done = run(ctx.clusterrun("launch", inv), env=ctx.env(), cwd=ctx.cwd, timeout=900)
        _check(done, "clusterrun")
        run_id = ctx.latest_run()["id"]
        return done, f"~/.clusterrun/runs/{run_id}/job/out/metrics.json"

    def by_hand() -> tuple:
        argvs = [cl.ssh_argv(i, f"rm -rf ~/{HOST_DIR}/out ~/{HOST_DIR}/data; " + baselines.rank_command(
            cl, str(i), "train_job/train.py", ARGS, folder=f"~/{HOST_DIR}", master_port=29520, background=False,
            extra_env=["CLUSTERRUN_DIST_URL=env://", "PYTHONUNBUFFERED=1"])) for i in range(n)]
        done = run_parallel(argvs, timeout=900)
        _check(done, "by-hand")
        return done, f"~/{HOST_DIR}/out/metrics.json"

    for rep in range(reps):
        for method in rotate(METHODS, rep):
            done, path = clusterrun() if method == "clusterrun" else by_hand()
            rc, out, err = cl.c.exec(cl.c.hosts[0], ["sh", "-c", f"cat {path}"], timeout=60)
            if rc:
                raise RuntimeError(f"training/{method}: no {path} on node0: {err.strip()}")
            metrics = json.loads(out)
            ctx.rec.add(SECTION, n, method, "samples_per_s", metrics["samples_per_s"], rep, "samples/s")
            ctx.rec.add(SECTION, n, method, "time", done.wall, rep)
        ctx.log(f"  training rep {rep + 1}/{reps}: " + ", ".join(
            f"{m} {ctx.rec.values(SECTION, n, m, 'samples_per_s')[-1]:.0f} samples/s" for m in METHODS))
    ctx.rec.note(SECTION, n, "train_job/train.py " + " ".join(ARGS) + f"; {n} ranks, one per host, gloo")
    ctx.check_no_leftovers(SECTION)


def _check(done: Done, method: str) -> None:
    if not done.ok:
        raise RuntimeError(f"training/{method} failed: {done.describe_failure()}")
