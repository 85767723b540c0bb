"""Relay push: the shape people have, a controller on a slow link and hosts that talk to each other fast.

The controller's link into the cluster is capped with `tc qdisc … tbf` on the cluster bridge's own
device (this machine → the hosts); host-to-host traffic is bridged between the ports and stays uncapped
(GUIDE.md §4). Under each cap, interleaved per repetition: clusterrun with the relay push
(`push: {relay: true}`), clusterrun with direct pushes (`push: {relay: false}`, the encrypted per-host
path), and rsync to every host at once. Every method starts from empty hosts (caches removed) and
fresh content. Times are the whole command (connections included; clusterrun: `launch --detach` of a
job that exits at once); the push phase is recorded beside it.

The figure that matters: relay push time at N hosts against the push to 1 host under the same cap
(1 host is always direct: there is nobody to relay to).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

from .. import baselines, plotting
from ..context import Context
from ..measure import rotate, run, run_parallel
from .push import make_tree

SECTION = "relay"
CAPS_MBIT = (1000, 200)
CORES = os.cpu_count() or 1
DEST = "bench-relay"


def shape(bridge: str, mbit: Optional[int]) -> None:
    """Cap this machine → the cluster at mbit (None: remove the cap)."""
    if mbit is None:
        subprocess.run(["tc", "qdisc", "del", "dev", bridge, "root"], capture_output=True)
        return
    burst = "1mb" if mbit >= 800 else "256kb"  # at least rate/HZ, or tbf cannot reach the rate
    subprocess.run(["tc", "qdisc", "replace", "dev", bridge, "root", "tbf", "rate", f"{mbit}mbit", "burst", burst,
                    "latency", "100ms"], check=True, capture_output=True)


def methods(n: int) -> List[str]:
    return (["relay"] if n >= 2 else []) + ["direct", "rsync"]


def run_section(ctx: Context, reps: int, data_mb: int = 100, files: int = 100, caps=CAPS_MBIT) -> None:
    n, cl = ctx.n, ctx.cluster
    tree = ctx.work / "relay-tree"
    invs = {mode: _inventory(ctx, tree, mode) for mode in ("relay", "direct")}
    rng = random.Random(20261201)
    bridge = cl._bridge

    def record(method: str, metric: str, value: float, rep: int, unit: str = "s") -> None:
        ctx.rec.add(SECTION, n, method, metric, value, rep, unit)

    def clean() -> None:
        cl.on_all(f"rm -rf ~/{DEST} ~/.clusterrun/runs/* ~/.clusterrun/cache && mkdir -p ~/{DEST}")

    try:
        for cap in caps:
            for rep in range(reps):
                for method in rotate(methods(n), rep):
                    payload = make_tree(tree, data_mb, files, rng)  # fresh content: nothing cached anywhere
                    clean()
                    shape(bridge, cap)
                    try:
                        if method == "rsync":
                            done = run_parallel(baselines.rsync(cl, tree, DEST), timeout=1200, net=cl.net_bytes,
                                                hosts_cpu=cl.hosts_cpu)
                        else:
                            done = run(ctx.clusterrun("launch", "--detach", invs[method]), env=ctx.env(), cwd=ctx.cwd,
                                       timeout=1200, net=cl.net_bytes, hosts_cpu=cl.hosts_cpu)
                    finally:
                        shape(bridge, None)
                    if not done.ok:
                        raise RuntimeError(f"relay/{method}@{cap}: {done.describe_failure()}")
                    name = f"{method}@{cap}"
                    record(name, "time", done.wall, rep)
                    record(name, "wire_bytes", done.net_tx, rep, "B")
                    record(name, "hosts_cpu", done.hosts_cpu, rep, "cpu-s")
                    if method != "rsync":
                        rec = ctx.latest_run()
                        record(name, "phase_push", (rec.get("phases") or {}).get("push", float("nan")), rep)
                        sent = sum(h.get("pushed_bytes") or 0 for h in rec["hosts"])
                        relayed = sum(h.get("relayed_bytes") or 0 for h in rec["hosts"])
                        record(name, "controller_bytes", sent, rep, "B")
                        if sent + relayed < n * (payload - 4096):  # noop.py may be cached: everything else new
                            raise RuntimeError(f"relay/{name}: {sent} + {relayed} bytes reached the hosts, "
                                               f"not {n} x {payload}")
                        _verify(ctx, tree)
                        for metric, value in breakdown(rec["hosts"], done.t0).items():
                            record(name, metric, value, rep)
                    ctx.log(f"  relay {n} hosts, {cap} Mbit/s, rep {rep + 1}/{reps}: {method} {done.wall:.2f}s")
        ctx.rec.note(SECTION, n, f"payload per host: {data_mb} MB random data + {files} files of 1-4 KB; "
                                 f"controller link capped with tbf at {', '.join(map(str, caps))} Mbit/s")
    finally:
        shape(bridge, None)
        clean()
        shutil.rmtree(tree, ignore_errors=True)
    ctx.check_no_leftovers(SECTION)


def _inventory(ctx: Context, tree: Path, mode: str) -> Path:
    """The section's inventory with the relay push on (mode relay) or off (direct)."""
    path = ctx.cluster.write_inventory(ctx.work / f"relay-{mode}.json", root=tree, script="noop.py",
                                       sync=["data/", "code/"])
    data = json.loads(path.read_text())
    data["push"] = {"relay": mode == "relay"}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def breakdown(hosts: List[dict], t0: float) -> Dict[str, float]:
    """Where a push's time went, from what each host reported (its push_detail, wall clock: the containers
    share this machine's clock): the barrier (spawn → the chain laid out, i.e. every host connected and
    said what it lacks), the chain head's first byte after that, the per-hop latency (median gap between
    one host's first byte and the next host's), the stream (first byte anywhere → last byte everywhere),
    and per host (mean) the seconds spent hashing, writing and passing on."""
    details = [h.get("push_detail") or {} for h in hosts]
    out: Dict[str, float] = {}
    laid = [d["laid_out"] for d in details if d.get("laid_out")]
    if laid:
        out.update(_chain(details, min(laid), t0))
    firsts = [d["first"] for d in details if d.get("first")]
    lasts = [d["last"] for d in details if d.get("last")]
    if firsts and lasts:
        out["stream"] = max(lasts) - min(firsts)
    out.update(_per_host(details))
    return out


def _per_host(details: List[dict]) -> Dict[str, float]:
    """breakdown's seconds hashing, writing and passing on: the mean over the hosts that reported them."""
    out = {}
    for key in ("hash_s", "write_s", "pass_s"):
        values = [d[key] for d in details if key in d]
        if values:
            out[key] = sum(values) / len(values)
    return out


def _chain(details: List[dict], laid_out: float, t0: float) -> Dict[str, float]:
    """breakdown's barrier, head_first_byte and hop, once the chain was laid out (at laid_out)."""
    out = {"barrier": laid_out - t0}
    chain = sorted((d["node"], d["first"]) for d in details if "node" in d and d.get("first"))
    if chain:
        out["head_first_byte"] = chain[0][1] - laid_out
    gaps = sorted(b[1] - a[1] for a, b in zip(chain, chain[1:]))
    if gaps:
        out["hop"] = gaps[len(gaps) // 2]
    return out


def _verify(ctx: Context, tree: Path) -> None:
    """Every host holds every file with every byte (count and total size of the newest run's job tree)."""
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    script = ("d=$(ls -td ~/.clusterrun/runs/*/job | head -1); printf '%s %s\\n' $(find -L \"$d\" -type f | wc -l) "
              "$(find -L \"$d\" -type f -printf '%s\\n' | awk '{s+=$1} END {print s+0}')")
    for h in ctx.cluster.c.hosts:
        rc, out, err = ctx.cluster.c.exec(h, ["bash", "-c", script], timeout=120)
        if rc or out.split() != [str(files), str(size)]:
            raise RuntimeError(f"relay: {h.name} lacks files (want {files} files, {size} bytes): {out} {err}")


# -------------------------------------------------------------------------------------------------- report

def caps_in(summary: Dict) -> List[int]:
    """The caps a run measured (its methods are named METHOD@CAP), fastest link first."""
    return sorted({int(m.split("@")[1]) for h in summary.get(SECTION, {}).values() for m in h if "@" in m},
                  reverse=True)


def rows(summary: Dict) -> List[dict]:
    """Per cap and size: medians of each method, and the relay's time against 1 host's push."""
    sec = summary.get(SECTION, {})
    out = []
    for cap in caps_in(summary):
        one = _get(sec, 1, f"direct@{cap}", "phase_push")
        one_time = _get(sec, 1, f"direct@{cap}", "time")
        for h in sorted(sec, key=int):
            row = {"cap": cap, "hosts": int(h)}
            for m in ("relay", "direct", "rsync"):
                row[m] = _get(sec, h, f"{m}@{cap}", "time")
                row[m + "_push"] = _get(sec, h, f"{m}@{cap}", "phase_push")
                row[m + "_hosts_cpu"] = _get(sec, h, f"{m}@{cap}", "hosts_cpu")
            best = row["relay"] if row["relay"] is not None else row["direct"]
            best_push = row["relay_push"] if row["relay_push"] is not None else row["direct_push"]
            row["vs_one"] = best_push / one if best_push and one else None
            row["vs_one_time"] = best / one_time if best and one_time else None
            out.append(row)
    return out


def _get(sec: Dict, hosts, method: str, metric: str) -> Optional[float]:
    try:
        return sec[str(hosts)][method][metric]["median"]
    except KeyError:
        return None


def markdown(summary: Dict) -> str:
    table = rows(summary)
    if not table:
        return ""
    f = lambda v, unit="s": "–" if v is None else f"{v:.2f}{unit}"  # noqa: E731
    lines = ["## Relay push: the same data to every host, the controller's link capped (payload: see the notes)", "",
             "Whole `launch --detach` (clusterrun) or parallel `rsync -a` (every host at once), medians; "
             "*push* is clusterrun's push phase; *÷ 1 host* is the push phase against the push to one host "
             "under the same cap (relay where measured, else direct). Hosts' CPU: every process in the hosts' "
             "containers, which share this machine's 2 cores with the controller: that CPU ÷ the cores is the least "
             "any push can take here, whatever the link (*CPU floor*).", "",
             "| cap | hosts | relay | relay push | direct | direct push | rsync | ÷ 1 host (push) | ÷ 1 host (whole) "
             "| hosts' CPU relay / direct | relay's CPU floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['cap']} Mbit/s | {r['hosts']} | {f(r['relay'])} | {f(r['relay_push'])} | {f(r['direct'])} "
                     f"| {f(r['direct_push'])} | {f(r['rsync'])} | {f(r['vs_one'], '×')} | {f(r['vs_one_time'], '×')} "
                     f"| {f(r['relay_hosts_cpu'])} / {f(r['direct_hosts_cpu'])} "
                     f"| {f(r['relay_hosts_cpu'] / CORES if r['relay_hosts_cpu'] else None)} |")
    lines += ["", "Where the time goes (medians; from the hosts' own reports, bench/sections/relay.py `breakdown`): "
              "*barrier*: spawn → the chain laid out (every host connected, claimed and said what it lacks); "
              "*head*: → the chain head's first byte; *hop*: the median gap between one host's first byte and the "
              "next one's; *stream*: first byte anywhere → last byte everywhere; per host, seconds hashing "
              "(SHA-256 of what it keeps), writing and passing on.", "",
              "| cap | hosts | method | barrier | head | hop | stream | hash | write | pass on |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    sec = summary.get(SECTION, {})
    for cap in caps_in(summary):
        for h in sorted(sec, key=int):
            for m in ("relay", "direct"):
                cell = lambda metric, m=m, h=h, cap=cap: f(_get(sec, h, f"{m}@{cap}", metric))  # noqa: E731
                if _get(sec, h, f"{m}@{cap}", "stream") is None:
                    continue
                lines.append(f"| {cap} Mbit/s | {h} | {m} | {cell('barrier')} | {cell('head_first_byte')} "
                             f"| {cell('hop')} | {cell('stream')} | {cell('hash_s')} | {cell('write_s')} "
                             f"| {cell('pass_s')} |")
    return "\n".join(lines) + "\n"


def plot(summary: Dict, path: Path) -> bool:
    table = rows(summary)
    if not table:
        return False
    plt = plotting.pyplot()
    caps = caps_in(summary)
    fig, axes = plt.subplots(1, len(caps), figsize=(6.2 * len(caps), 4.4), squeeze=False)
    for ax, cap in zip(axes[0], caps):
        mine = [r for r in table if r["cap"] == cap]
        for key, label in (("relay", "clusterrun, relay push"), ("direct", "clusterrun, direct pushes"),
                           ("rsync", "rsync -a to every host")):
            pts = [(r["hosts"], r[key]) for r in mine if r[key] is not None]
            if key == "relay":  # one host: nobody to relay to, the direct push is the relay's starting point
                pts = sorted(pts + [(r["hosts"], r["direct"]) for r in mine if r["hosts"] == 1 and r["direct"]])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, lw=2.5 if key == "relay" else 1.3)
        plotting.finish_axes(ax, f"Push to N hosts, controller link {cap} Mbit/s",
                             "seconds (median, whole command)", {r["hosts"] for r in mine})
    return plotting.save(fig, path)
