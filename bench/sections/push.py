"""Push: 100 MB of data plus a 1,000-file code tree to every host, first time and unchanged.

Every repetition makes fresh content (a new random data file, new small files), so clusterrun's first
push of each repetition finds nothing in the hosts' content caches. The copies are checked on the
hosts (file count and bytes) and removed between repetitions.

Times are spawn → exit of the whole command (connections included). For clusterrun that is a whole
`launch --detach` of a job that does nothing (connect, push, start): a conservative number; its
push phase alone is recorded beside it. Bytes on the wire are counted on the cluster's bridge.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

from .. import baselines
from ..context import JOBS, Context
from ..measure import Done, rotate, run, run_parallel

SECTION = "push"
METHODS = ("clusterrun", "scp", "rsync", "sftp", "floor")  # clusterrun = first push, then unchanged
DEST = "bench-push"


def make_tree(root: Path, data_mb: int, files: int, rng: random.Random) -> int:
    """data/blob.bin (random, incompressible) and code/ with `files` files of 1-4 KB in nested folders."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True)
    with open(root / "data" / "blob.bin", "wb") as fh:
        for _ in range(data_mb):
            fh.write(os.urandom(1 << 20))
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 _=()\n"
    for i in range(files):
        d = root / "code" / f"pkg{i // 100:02d}" / f"mod{i // 10 % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i % 10}.py").write_text("".join(rng.choices(alphabet, k=rng.randint(1024, 4096))))
    shutil.copy(JOBS / "noop.py", root / "noop.py")
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def run_section(ctx: Context, reps: int, data_mb: int = 100, files: int = 1000) -> None:
    n, cl = ctx.n, ctx.cluster
    tree = ctx.work / "push-tree"
    inv = cl.write_inventory(ctx.work / "push.json", root=tree, script="noop.py", sync=["data/", "code/"])
    data = json.loads(inv.read_text())
    data["push"] = {"relay": False}  # the direct path (one SSH channel per host) against scp/rsync; relay.py has its own
    inv.write_text(json.dumps(data, indent=1) + "\n")
    rng = random.Random(20261130)
    for rep in range(-1, reps):  # rep -1: warm-up (first connections, page cache), not recorded
        payload = make_tree(tree, data_mb if rep >= 0 else 1, files if rep >= 0 else 10, rng)
        cl.on_all(f"rm -rf ~/{DEST} ~/.clusterrun/runs/* && mkdir -p ~/{DEST}/scp ~/{DEST}/rsync ~/{DEST}/sftp")
        for method in rotate(METHODS, max(rep, 0)):
            if method == "clusterrun":
                _clusterrun(ctx, inv, rep, payload)
            elif method == "floor":
                _floor(ctx, rep)
            else:
                _copy(ctx, tree, method, rep)
        _verify(ctx, tree, rep)
        cl.on_all(f"rm -rf ~/{DEST} ~/.clusterrun/runs/* ~/.clusterrun/cache")
        if rep >= 0:
            ctx.log(f"  push rep {rep + 1}/{reps}: " + ", ".join(
                f"{m} {ctx.rec.values(SECTION, n, m, 'time')[-1]:.2f}s"
                for m in ("clusterrun", "clusterrun-unchanged", "scp", "rsync", "sftp", "floor")))
    shutil.rmtree(tree, ignore_errors=True)
    ctx.rec.note(SECTION, n, f"payload per host: {data_mb} MB random data + {files} files of 1-4 KB")
    ctx.check_no_leftovers(SECTION)


def _record(ctx: Context, method: str, metric: str, value: float, rep: int, unit: str = "s") -> None:
    if rep >= 0:
        ctx.rec.add(SECTION, ctx.n, method, metric, value, rep, unit)


def _clusterrun(ctx: Context, inv: Path, rep: int, payload: int) -> None:
    """The first push of fresh content, then the same launch again (unchanged)."""
    n, cl = ctx.n, ctx.cluster
    for method in ("clusterrun", "clusterrun-unchanged"):
        done = run(ctx.clusterrun("launch", "--detach", inv), env=ctx.env(), cwd=ctx.cwd, timeout=900,
                   net=cl.net_bytes, hosts_cpu=cl.hosts_cpu)
        _check(done, method)
        rec = ctx.latest_run()
        phases = rec.get("phases") or {}
        sent = sum(h.get("pushed_bytes") or 0 for h in rec["hosts"])
        _record(ctx, method, "time", done.wall, rep)
        _record(ctx, method, "phase_push", phases.get("push", float("nan")), rep)
        _record(ctx, method, "phase_connect", phases.get("connect", float("nan")), rep)
        _record(ctx, method, "cpu", done.cpu, rep, "cpu-s")
        _record(ctx, method, "hosts_cpu", done.hosts_cpu, rep, "cpu-s")
        _record(ctx, method, "wire_bytes", done.net_tx, rep, "B")
        _record(ctx, method, "payload_bytes", sent, rep, "B")
        if method == "clusterrun" and sent < n * payload:
            raise RuntimeError(f"push: clusterrun's first push sent {sent} bytes, less than "
                               f"{n} x {payload}: the content was not new")


def _copy(ctx: Context, tree: Path, method: str, rep: int) -> None:
    """One baseline copy of the tree to every host: scp, rsync or paramiko SFTP."""
    cl, net = ctx.cluster, ctx.cluster.net_bytes
    dest = f"{DEST}/{method}"
    if method == "scp":
        done = run_parallel(baselines.scp(cl, [tree / "data", tree / "code"], dest), timeout=900, net=net,
                            hosts_cpu=cl.hosts_cpu)
    elif method == "rsync":
        done = run_parallel(baselines.rsync(cl, tree, dest), timeout=900, net=net, hosts_cpu=cl.hosts_cpu)
    else:
        done = run(baselines.sftp(cl, tree, dest), timeout=900, net=net, hosts_cpu=cl.hosts_cpu)
    _check(done, method)
    _record(ctx, method, "time", done.wall, rep)
    _record(ctx, method, "cpu", done.cpu, rep, "cpu-s")
    _record(ctx, method, "hosts_cpu", done.hosts_cpu, rep, "cpu-s")
    _record(ctx, method, "wire_bytes", done.net_tx, rep, "B")


def _floor(ctx: Context, rep: int) -> None:
    done = run(baselines.floor(ctx.cluster), timeout=120)
    _check(done, "floor")
    _record(ctx, "floor", "time", done.wall, rep)


def _payload(tree: Path) -> tuple:
    """(files, bytes) of the tree that every method copies (noop.py is clusterrun's script, not payload)."""
    kept = [p for p in tree.rglob("*") if p.is_file() and p.name != "noop.py"]
    return len(kept), sum(p.stat().st_size for p in kept)


def _verify(ctx: Context, tree: Path, rep: int) -> None:
    """Every method delivered every file with every byte, on every host."""
    files, size = _payload(tree)
    script = (f"for d in ~/{DEST}/scp ~/{DEST}/rsync ~/{DEST}/sftp $(ls -d ~/.clusterrun/runs/*/job); do "
              "printf '%s %s %s\\n' \"$d\" $(find -L \"$d\" -type f ! -name noop.py | wc -l) "
              "$(find -L \"$d\" -type f ! -name noop.py -printf '%s\\n' | awk '{s+=$1} END {print s+0}'); done")
    for h in ctx.cluster.c.hosts:
        rc, out, err = ctx.cluster.c.exec(h, ["bash", "-c", script], timeout=120)
        rows = [line.split() for line in out.splitlines()]
        bad = [r for r in rows if len(r) != 3 or int(r[1]) != files or int(r[2]) != size]
        if rc or bad or len(rows) < 5:
            raise RuntimeError(f"push rep {rep}: {h.name} lacks files (want {files} files, {size} bytes): "
                               f"{out.strip()} {err.strip()}")


def _check(done: Done, method: str) -> None:
    if not done.ok:
        raise RuntimeError(f"push/{method} failed: {done.describe_failure()}")
