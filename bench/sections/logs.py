"""Logs: every rank printing numbered lines flat out (throughput, loss, controller CPU), and a line
printed once a second (delay from print to arrival here).

The bench reads the launcher's stdout in large chunks and timestamps each chunk as it arrives; the
lines are checked afterwards (every rank's every sequence number exactly once, no line damaged), so
the bench's own reading costs little while the rate is measured. Baseline: OpenSSH, `ssh host python
flood.py` to every host at once, each through its own ssh's stdout.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Tuple

from .. import baselines
from ..context import HOST_JOBS, JOBS, Context
from ..measure import percentile, rotate, run_parallel

SECTION = "logs"
METHODS = ("clusterrun", "ssh")
WIDTH = 80
# a launch folds its live view by default from FOLD_AT ranks, holding a line up to FOLD_WINDOW s
# (clusterrun/ui/fold.py; the bench imports nothing of the clusterrun it measures, which may be another
# version: --at, --versus)
FOLD_AT = 16
FOLD_WINDOW = 0.2


class Chunks:
    """(arrival time, bytes) per process, appended from the reader threads."""

    def __init__(self):
        self.items: List[Tuple[float, bytes]] = []
        self._lock = threading.Lock()

    def __call__(self, index: int, t: float, data: bytes) -> None:
        with self._lock:
            self.items.append((t, data))


def tally(blobs: List[bytes], n: int, per_rank: int, prefixed: bool) -> Dict[str, float]:
    """Count lines; check that every (rank, seq) arrived exactly once and undamaged.

    `blobs`: one per stream, in arrival order (a line never spans two streams)."""
    seen = [bytearray(per_rank) for _ in range(n)]
    good = dup = damaged = other = 0
    for blob in blobs:
        for line in blob.split(b"\n"):
            if not line:
                continue
            if prefixed:  # `[node3 r3] 3 000000042 xxx...`
                k = line.find(b"] ")
                if k < 0:
                    other += 1
                    continue
                line = line[k + 2:]
            parts = line.split(b" ", 2)
            try:
                r, s = int(parts[0]), int(parts[1])
                slot = seen[r]
                known = slot[s]
            except (ValueError, IndexError):
                other += 1
                continue
            if len(line) != WIDTH - 1:
                damaged += 1
            if known:
                dup += 1
            else:
                slot[s] = 1
                good += 1
    return {"lines": good + dup, "lost": n * per_rank - good, "duplicated": dup, "damaged": damaged,
            "other": other}


def arrival_span(chunks: Chunks) -> Tuple[float, float]:
    times = [t for t, _ in chunks.items]
    return (min(times), max(times)) if times else (0.0, 0.0)


def _flood(ctx: Context, inv, method: str, rep: int, lines: int) -> None:
    n, cl = ctx.n, ctx.cluster
    flood_args = ["--lines", str(lines), "--width", str(WIDTH)]
    if method == "clusterrun":
        argvs = [ctx.clusterrun("launch", inv, "--", *flood_args)]
        kw = dict(env=ctx.env(), cwd=ctx.cwd)
    else:
        argvs = baselines.ssh_each(cl, "flood.py", lambda i: flood_args, f"~/{HOST_JOBS}")
        kw = {}
    per = [Chunks() for _ in argvs]
    done = run_parallel(argvs, timeout=600, on_chunk=lambda i, t, d: per[i](i, t, d), hosts_cpu=cl.hosts_cpu,
                        **kw)
    if not done.ok:
        raise RuntimeError(f"logs/{method} failed: {done.describe_failure()}")
    all_chunks = Chunks()
    all_chunks.items = [item for p in per for item in p.items]
    first, last = arrival_span(all_chunks)
    counts = tally([b"".join(c for _, c in p.items) for p in per], n, lines, prefixed=(method == "clusterrun"))
    if rep < 0:
        return
    add = lambda metric, value, unit: ctx.rec.add(SECTION, n, method, metric, value, rep, unit)  # noqa: E731
    add("lines_per_s", counts["lines"] / max(1e-9, last - first), "lines/s")
    add("lines_per_s_e2e", counts["lines"] / max(1e-9, done.t_end - done.t0), "lines/s")
    add("cpu", done.cpu, "cpu-s")
    add("hosts_cpu", done.hosts_cpu, "cpu-s")
    add("cpu_per_mline", done.cpu / max(1, counts["lines"]) * 1e6, "cpu-s")
    for key in ("lost", "duplicated", "damaged", "other"):
        add(key, counts[key], "lines")
    add("time", done.wall, "s")


def _tick_delays(chunks: Chunks) -> List[float]:
    """Arrival time minus the time each TICK line says it was printed."""
    delays = []
    for t, data in chunks.items:
        for line in data.split(b"\n"):
            k = line.find(b"TICK ")
            if k < 0:
                continue
            try:
                delays.append(t - float(line[k:].split()[3]))
            except (ValueError, IndexError):  # not a tick, or a tick cut in two by a read
                continue
    return delays


def _delay(ctx: Context, inv, method: str, rep: int, ticks: int) -> None:
    n, cl = ctx.n, ctx.cluster
    tick_args = ["--ticks", str(ticks)]
    chunks = Chunks()
    if method.startswith("clusterrun"):  # clusterrun-no-fold: the transport alone, without the fold's window
        flags = ["--no-fold"] if method == "clusterrun-no-fold" else []
        done = run_parallel([ctx.clusterrun("launch", *flags, inv, "--", *tick_args)], env=ctx.env(),
                            cwd=ctx.cwd, timeout=300, on_chunk=chunks)
    else:
        done = run_parallel(baselines.ssh_each(cl, "ticker.py", lambda i: tick_args, f"~/{HOST_JOBS}"),
                            timeout=300, on_chunk=chunks)
    if not done.ok:
        raise RuntimeError(f"logs/{method} (delay) failed: {done.describe_failure()}")
    delays = _tick_delays(chunks)
    if len(delays) != n * ticks:
        ctx.rec.note(SECTION, n, f"delay {method} rep {rep}: {len(delays)} of {n * ticks} ticks arrived")
    for d in delays:
        ctx.rec.add(SECTION, n, method, "delay", d, rep)
    ctx.rec.add(SECTION, n, method, "delay_p50", percentile(delays, 50), rep)


def run_section(ctx: Context, reps: int, total_lines: int = 1_000_000, ticks: int = 8,
                delay_reps: int = 3) -> None:
    n, cl = ctx.n, ctx.cluster
    per_rank = total_lines // n
    ctx.install_host_jobs()
    flood_inv = cl.write_inventory(ctx.work / "flood.json", root=JOBS, script="flood.py")
    tick_inv = cl.write_inventory(ctx.work / "ticker.json", root=JOBS, script="ticker.py")
    for method in METHODS:
        _flood(ctx, flood_inv, method, -1, lines=1000)  # warm-up
    for rep in range(reps):
        for method in rotate(METHODS, rep):
            _flood(ctx, flood_inv, method, rep, per_rank)
        ctx.log(f"  logs rep {rep + 1}/{reps}: " + ", ".join(
            f"{m} {ctx.rec.values(SECTION, n, m, 'lines_per_s')[-1] / 1e3:.0f}k lines/s "
            f"(lost {ctx.rec.values(SECTION, n, m, 'lost')[-1]:.0f})" for m in METHODS))
    # from FOLD_AT ranks a launch folds its live view by default, which holds each line up to its window
    # (docs/logs.md): the delay then also without folding, the transport's own
    delay_methods = METHODS + (("clusterrun-no-fold",) if n >= FOLD_AT else ())
    for rep in range(delay_reps):
        for method in rotate(delay_methods, rep):
            _delay(ctx, tick_inv, method, rep, ticks)
        ctx.log(f"  delay rep {rep + 1}/{delay_reps}: " + ", ".join(
            f"{m} p50 {ctx.rec.values(SECTION, n, m, 'delay_p50')[-1] * 1e3:.1f} ms" for m in delay_methods))
    ctx.rec.note(SECTION, n, f"flood: {per_rank} lines of {WIDTH} bytes per rank ({n * per_rank} in all); "
                             f"delay: {ticks} lines per rank, one a second, {delay_reps} repetitions pooled")
    ctx.check_no_leftovers(SECTION)
