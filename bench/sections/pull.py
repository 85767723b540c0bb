"""Pull: a run's outputs (100 MB of random data + 1,000 small files per host) back to this machine, from
rank 0's host and from every host, first time and unchanged, against scp and rsync of the same folder.

Each repetition launches a fresh run (`jobs/results.py` on every host writes new random content), then
every method copies its outputs/ folder into an empty folder here, in a rotating order; the unchanged
figures are the same command again into the same folder. Every copy is checked (file count and bytes).
Times are spawn → exit (connections included). Bytes on the wire are counted on the cluster's bridge,
hosts → here (`rx`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import List

from ..context import JOBS, Context
from ..measure import Done, rotate, run, run_parallel

SECTION = "pull"
FIRST = ("clusterrun", "scp", "rsync")  # one host (rank 0's), into an empty folder
ALL = ("clusterrun-all", "scp-all", "rsync-all")  # every host at once, a folder each


def run_section(ctx: Context, reps: int, data_mb: int = 100, files: int = 1000) -> None:
    cl = ctx.cluster
    root = ctx.work / "pull-job"
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(JOBS / "results.py", root / "results.py")
    inv = cl.write_inventory(ctx.work / "pull.json", root=root, script="results.py")

    for rep in range(-1, reps):  # rep -1: warm-up (first connections, the host program), not recorded
        mb, count = (data_mb, files) if rep >= 0 else (1, 10)
        run_id = _fresh_run(ctx, inv, mb, count)
        src = f".clusterrun/runs/{run_id}/job/outputs"
        out = ctx.work / "pulled"
        shutil.rmtree(out, ignore_errors=True)
        for method in rotate(FIRST, max(rep, 0)) + rotate(ALL, max(rep, 0)):
            _measure(ctx, rep, method, run_id, src, out / method, mb, count)
        shutil.rmtree(out, ignore_errors=True)
        cl.on_all("rm -rf ~/.clusterrun/runs/* ~/.clusterrun/cache/pull-sums.json")
        if rep >= 0:
            ctx.log(f"  pull rep {rep + 1}/{reps}: " + ", ".join(
                f"{m} {ctx.rec.values(SECTION, ctx.n, m, 'time')[-1]:.2f}s"
                for m in FIRST + ("clusterrun-unchanged", "rsync-unchanged") + ALL))
    ctx.rec.note(SECTION, ctx.n, f"outputs per host: {data_mb} MB random data + {files} files of 1-4 KB")
    ctx.check_no_leftovers(SECTION)


def _fresh_run(ctx: Context, inv: Path, mb: int, files: int) -> str:
    done = run(ctx.clusterrun("launch", inv, "--", "--mb", str(mb), "--files", str(files)), env=ctx.env(),
               cwd=ctx.cwd, timeout=900)
    if not done.ok:
        raise RuntimeError(f"pull: the run that writes the outputs failed: {done.describe_failure()}")
    return ctx.latest_run()["id"]


def _argvs(ctx: Context, method: str, run_id: str, src: str, dest: Path) -> List[List[str]]:
    cl = ctx.cluster
    dest.mkdir(parents=True, exist_ok=True)
    hosts = range(cl.n) if method.endswith("-all") else [0]
    if method.startswith("clusterrun"):
        return [ctx.clusterrun("pull", run_id, "outputs/", "--to", dest, *(["--all-hosts"] if method.endswith("-all")
                                                                          else []))]
    shell = ["ssh", *cl.ssh_options()]
    argvs = []
    for i in hosts:
        where = dest / cl.names[i] if method.endswith("-all") else dest
        where.mkdir(parents=True, exist_ok=True)
        remote = f"{cl.user}@{cl.addresses[i]}:{src}"
        if method.startswith("scp"):
            argvs.append(["scp", "-r", "-q", "-p", *cl.ssh_options(), remote, str(where)])
        else:
            argvs.append(["rsync", "-a", "-e", " ".join(shell), f"{remote}/", f"{where}/outputs/"])
    return argvs


def _measure(ctx: Context, rep: int, method: str, run_id: str, src: str, dest: Path, mb: int, files: int) -> None:
    """One method into its folder; for clusterrun and rsync the same again (unchanged) right after."""
    again = {"clusterrun": "clusterrun-unchanged", "rsync": "rsync-unchanged"}.get(method)
    for name in (method, again) if again else (method,):
        rx0 = ctx.cluster.net_bytes()["rx"]
        argvs = _argvs(ctx, name.replace("-unchanged", ""), run_id, src, dest)
        done = run_parallel(argvs, env=ctx.env(), cwd=ctx.cwd, timeout=900, hosts_cpu=ctx.cluster.hosts_cpu)
        wire = ctx.cluster.net_bytes()["rx"] - rx0
        _check(done, name)
        _verify(dest, name, ctx.cluster.n if name.startswith(tuple(ALL)) else 1, mb, files)
        if rep >= 0:
            for metric, value, unit in (("time", done.wall, "s"), ("cpu", done.cpu, "cpu-s"),
                                        ("hosts_cpu", done.hosts_cpu, "cpu-s"), ("wire_bytes", wire, "B")):
                ctx.rec.add(SECTION, ctx.n, name, metric, value, rep, unit)


def _verify(dest: Path, method: str, hosts: int, mb: int, files: int) -> None:
    """Every host's model.bin and small files arrived whole (and no .part is left)."""
    found = [p for p in dest.rglob("*") if p.is_file()]
    models = [p for p in found if p.name == "model.bin"]
    parts = [p for p in found if p.name.endswith(".part")]
    if len(models) != hosts or any(p.stat().st_size != mb << 20 for p in models) or parts \
            or len(found) != hosts * (files + 1):
        raise RuntimeError(f"pull/{method}: {len(found)} files in {dest} ({len(models)} model.bin, "
                           f"{len(parts)} .part), want {hosts * (files + 1)}")


def _check(done: Done, method: str) -> None:
    if not done.ok:
        raise RuntimeError(f"pull/{method} failed: {done.describe_failure()}")

