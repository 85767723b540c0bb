"""Profile the controller at the largest size: the first push (the slowest phase), an unchanged
launch (the launch path: round trips and start-up), and a log flood.

Each scenario runs twice: under py-spy (CPU: which Python code runs, every thread) and under
pyinstrument (wall time of the main thread: imports, connect, push, start, follow).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Callable, List

from .. import pyspy
from ..context import JOBS, Context
from . import push


def run_section(ctx: Context, out: Path, data_mb: int = 100, files: int = 1000,
                lines: int = 1_000_000) -> List[dict]:
    n, cl = ctx.n, ctx.cluster
    found = []

    def one(what: str, name: str, args: List[str], before: Callable[[], None]) -> None:
        stem = f"profile-{name}-{n}"
        before()
        cpu = pyspy.record_cpu(ctx.clusterrun(*args), out / f"{stem}.raw", env=ctx.env(), cwd=ctx.cwd)
        before()
        wall = pyspy.record_wall(["clusterrun", *args], out / f"{stem}-wall.txt", out / f"{stem}-wall.html",
                                 env=ctx.env(), cwd=ctx.cwd)
        if not cpu.ok or not (out / f"{stem}.raw").exists():
            ctx.rec.note("profile", n, f"{what}: py-spy failed: {cpu.describe_failure()}")
            return
        if not wall.ok:
            ctx.rec.note("profile", n, f"{what}: pyinstrument failed: {wall.describe_failure()}")
        text, data = pyspy.summarize(out / f"{stem}.raw")
        (out / f"{stem}.txt").write_text(f"{what}, {n} hosts: clusterrun {' '.join(args)}\n"
                                         f"wall {cpu.wall:.2f} s under py-spy\n\n{text}")
        found.append({"what": what, "hosts": n, "raw": f"{stem}.raw", "text": f"{stem}.txt",
                      "wall_text": f"{stem}-wall.txt", "wall_s": cpu.wall, "wall_s_pyinstrument": wall.wall,
                      **data})
        ctx.log(f"  profile {what}: {stem}.txt; top self: " +
                ", ".join(f"{k} {p:.0f}%" for k, p in data["self"][:3]))

    tree = ctx.work / "profile-tree"
    rng = random.Random(7)
    inv = cl.write_inventory(ctx.work / "profile-push.json", root=tree, script="noop.py", sync=["data/", "code/"])

    def fresh_tree() -> None:  # new content: a first push every time
        cl.on_all("rm -rf ~/.clusterrun/runs/* ~/.clusterrun/cache")
        push.make_tree(tree, data_mb, files, rng)

    one(f"first push (launch --detach, {data_mb} MB + {files:,} files)", "push", ["launch", "--detach", str(inv)],
        fresh_tree)
    one("unchanged launch (launch --detach, same tree again)", "unchanged", ["launch", "--detach", str(inv)],
        lambda: None)
    cl.on_all("rm -rf ~/.clusterrun/runs/* ~/.clusterrun/cache")
    shutil.rmtree(tree, ignore_errors=True)

    flood = cl.write_inventory(ctx.work / "profile-flood.json", root=JOBS, script="flood.py")
    one("log flood (launch, attached)", "logs", ["launch", str(flood), "--", "--lines", str(lines // n)],
        lambda: None)
    ctx.check_no_leftovers("profile")
    return found
