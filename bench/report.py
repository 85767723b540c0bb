"""From results.json: medians, ratios, targets (pass/miss), the markdown tables and the plot.

    python -m bench.report bench/results/<stamp> [--docs]   # re-render; --docs also writes docs/bench.md

Times are seconds; every figure is the median over the repetitions (interleaved: A B C, B C A, ...),
with min-max in results.json. Ratios are paired: the median over repetitions of the ratio within one
repetition (see PAIRS).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Optional

from . import plotting, tables
from .sections import logs as logs_section, relay
from .measure import median, percentile

REPO = Path(__file__).resolve().parents[1]


# Ratios are paired: within one repetition the methods ran back to back (interleaved), so their
# ratio cancels the machine's drift (other work on this shared machine moves times by 2x between
# minutes); the figure is the median over repetitions of those per-repetition ratios.
PAIRS = {  # section: (name, numerator method, denominator method, metric)
    "attached": [("clusterrun/floor", "clusterrun", "floor", "time"),
                 ("cpu clusterrun/floor", "clusterrun", "floor", "total_cpu"),
                 ("ctl-cpu clusterrun/floor", "clusterrun", "floor", "cpu"),
                 ("hosts-cpu clusterrun/floor", "clusterrun", "floor", "hosts_cpu"),
                 ("ssh-serial/clusterrun", "ssh-serial", "clusterrun", "time"),
                 ("pdsh/clusterrun", "pdsh", "clusterrun", "time"),
                 ("clusterrun/versus", "clusterrun", "versus", "time"),  # --versus REV: the change's effect
                 ("cpu clusterrun/versus", "clusterrun", "versus", "total_cpu"),
                 ("versus/floor", "versus", "floor", "time"),
                 ("cpu versus/floor", "versus", "floor", "total_cpu")],
    "launch": [("clusterrun/floor", "clusterrun", "floor", "time"),
               ("clusterrun/fair-floor", "clusterrun", "floor-job", "time"),
               ("cpu clusterrun/fair-floor", "clusterrun", "floor-job", "total_cpu"),
               ("pdsh/clusterrun", "pdsh", "clusterrun", "time"),
               ("ssh-serial/clusterrun", "ssh-serial", "clusterrun", "time"),
               ("clusterrun/pdsh", "clusterrun", "pdsh", "time")],
    "push": [("sftp/clusterrun", "sftp", "clusterrun", "time"),
             ("fastest/clusterrun", "fastest", "clusterrun", "time"),
             ("unchanged/floor", "clusterrun-unchanged", "floor", "time")],
    "logs": [("clusterrun/ssh", "clusterrun", "ssh", "lines_per_s")],
    "training": [("clusterrun/by-hand", "clusterrun", "by-hand", "samples_per_s")],
    "restarts": [("clusterrun/torchrun", "clusterrun", "torchrun", "time")],
    "pull": [("scp/clusterrun", "scp", "clusterrun", "time"), ("rsync/clusterrun", "rsync", "clusterrun", "time"),
             ("rsync-unchanged/clusterrun-unchanged", "rsync-unchanged", "clusterrun-unchanged", "time"),
             ("scp-all/clusterrun-all", "scp-all", "clusterrun-all", "time"),
             ("rsync-all/clusterrun-all", "rsync-all", "clusterrun-all", "time")],
    "scale": [("launch/floor", "launch", "launch floor", "time"), ("exec/floor", "exec", "exec floor", "time")],
    "hostcpu": [("clusterrun/floor", "clusterrun", "floor", "cpu_total"),
                ("clusterrun/versus", "clusterrun", "versus", "cpu_total"), ("versus/floor", "versus", "floor", "cpu_total")],
    "claims": [("claims/no-claims", "claims", "no-claims", "time"),
               ("cpu claims/no-claims", "claims", "no-claims", "total_cpu")],
}
FASTEST_OF = ("scp", "rsync", "sftp")


def paired(samples: List[dict]) -> List[dict]:
    """Per repetition, the ratios of PAIRS, as samples of method "ratio"."""
    by = defaultdict(dict)
    for s in samples:
        by[(s["section"], s["hosts"], s["rep"])][(s["method"], s["metric"])] = s["value"]
    out = []
    for (sec, h, rep), v in sorted(by.items()):
        fastest = [v[(m, "time")] for m in FASTEST_OF if (m, "time") in v]
        if sec == "push" and len(fastest) == len(FASTEST_OF):
            v[("fastest", "time")] = min(fastest)
        for name, num, den, metric in PAIRS.get(sec, ()):
            if (num, metric) in v and v.get((den, metric)):
                out.append({"section": sec, "hosts": h, "method": "ratio", "metric": name, "rep": rep,
                            "unit": "x", "value": v[(num, metric)] / v[(den, metric)]})
    return out


def summarize(samples: List[dict]) -> Dict:
    """section → hosts → method → metric → {median, min, max, n, unit} (delay: pooled p50/p95)."""
    samples = list(samples) + paired(samples)
    groups: Dict = defaultdict(list)
    units = {}
    for s in samples:
        key = (s["section"], s["hosts"], s["method"], s["metric"])
        groups[key].append(s["value"])
        units[key] = s["unit"]
    out: Dict = {}
    for (sec, h, m, metric), values in groups.items():
        cell = {"median": median(values), "min": min(values), "max": max(values), "n": len(values),
                "p90": percentile(values, 90), "sum": sum(values), "unit": units[(sec, h, m, metric)]}
        if metric == "delay":
            cell.update(p50=percentile(values, 50), p95=percentile(values, 95))
        out.setdefault(sec, {}).setdefault(str(h), {}).setdefault(m, {})[metric] = cell
    return out


def get(summary: Dict, sec: str, hosts, method: str, metric: str, stat: str = "median") -> Optional[float]:
    try:
        return summary[sec][str(hosts)][method][metric][stat]
    except KeyError:
        return None


def evaluate(summary: Dict) -> List[dict]:
    """Every target of issue 8 at every size measured: value, target, pass (None: not measured)."""
    rows = []

    def add(target: str, hosts, value: Optional[float], ok: Optional[bool], show: str) -> None:
        rows.append({"target": target, "hosts": int(hosts), "value": value, "pass": ok, "shown": show})

    for targets in (attached_targets, launch_targets, push_targets, logs_targets, teardown_targets,
                    restarts_targets, stacks_targets, training_targets, claims_targets):
        targets(summary, add)
    return rows


def _sizes(summary: Dict, sec: str) -> List[str]:
    return sorted(summary.get(sec, {}), key=int)


def _held(value: Optional[float], test: Callable[[float], bool]) -> Optional[bool]:
    """Whether a measured figure meets its target; None where it was not measured."""
    return None if value is None else test(value)


def _seconds(t: Optional[float]) -> str:
    return "" if t is None else f"{t:.2f} s"


def launch_targets(summary: Dict, add) -> None:
    """The targets for `launch --detach` (bench/sections/launch.py), each through add."""
    for h in _sizes(summary, "launch"):
        pr = lambda name, h=h: get(summary, "launch", h, "ratio", name)  # noqa: E731
        at16 = int(h) >= 16
        r = pr("clusterrun/floor")
        add("launch ≤ 1.3× the floor", h, r, _held(r, lambda v: v <= 1.3), tables.times(r))
        r = pr("clusterrun/fair-floor")
        add("launch ≤ 1.5× the fair floor (paramiko starting the job's Python)", h, r,
            _held(r, lambda v: v <= 1.5), tables.times(r))
        r = pr("pdsh/clusterrun")
        add("launch ≥ 3× faster than pdsh" + ("" if at16 else " (target at 16 hosts)"), h, r,
            _held(r, lambda v: v >= 3) if at16 else None, tables.times(r))
        r = pr("cpu clusterrun/fair-floor")
        add("CPU per launch (controller + hosts) ≤ 2× the fair floor's", h, r, _held(r, lambda v: v <= 2),
            tables.times(r))
        r = pr("ssh-serial/clusterrun")
        add("launch ≥ 5× faster than the serial ssh loop" + ("" if at16 else " (target at 16 hosts)"),
            h, r, _held(r, lambda v: v >= 5) if at16 else None, tables.times(r))
        r = pr("clusterrun/pdsh")
        add("launch not slower than pdsh", h, r, _held(r, lambda v: v <= 1.0), tables.times(r) + " of pdsh")


def push_targets(summary: Dict, add) -> None:
    """The push's targets (bench/sections/push.py), each through add."""
    for h in _sizes(summary, "push"):
        pr = lambda name, h=h: get(summary, "push", h, "ratio", name)  # noqa: E731
        r = pr("sftp/clusterrun")
        add("first push ≥ 2× default SFTP", h, r, _held(r, lambda v: v >= 2), tables.times(r))
        r = pr("fastest/clusterrun")
        add("first push ≥ 80% of the fastest baseline", h, r, _held(r, lambda v: v >= 0.8),
            "" if r is None else f"{100 * r:.0f}%")
        b = get(summary, "push", h, "clusterrun-unchanged", "wire_bytes", "max")
        b = None if b is None else b / int(h)
        add("unchanged push sends < 1 MB (per host, on the wire, the whole launch)", h, b,
            _held(b, lambda v: v < 1e6), "" if b is None else f"{b / 1e3:.0f} kB per host")
        r = pr("unchanged/floor")
        add("unchanged push ≤ 1.2× the launch floor", h, r, _held(r, lambda v: v <= 1.2), tables.times(r))


def logs_targets(summary: Dict, add) -> None:
    """The targets for following logs (bench/sections/logs.py), each through add."""
    for h in _sizes(summary, "logs"):
        v = get(summary, "logs", h, "clusterrun", "lines_per_s")
        add("logs ≥ 100k lines/s aggregate", h, v, _held(v, lambda x: x >= 1e5),
            "" if v is None else f"{v / 1e3:.0f}k/s")
        lost = get(summary, "logs", h, "clusterrun", "lost", "max")
        if lost is not None:
            dmg = get(summary, "logs", h, "clusterrun", "damaged", "max") or 0
            dup = get(summary, "logs", h, "clusterrun", "duplicated", "max") or 0
            bad = lost + dmg + dup
            add("logs: no line lost, duplicated or damaged", h, bad, bad == 0,
                f"{lost:.0f} lost, {dup:.0f} dup, {dmg:.0f} damaged")
        p50 = get(summary, "logs", h, "clusterrun", "delay", "p50")
        plain = get(summary, "logs", h, "clusterrun-no-fold", "delay", "p50")
        if plain is None:
            add("log delay p50 < 100 ms", h, p50, _held(p50, lambda x: x < 0.1),
                "" if p50 is None else f"{p50 * 1e3:.0f} ms")
            continue
        add("log delay p50 < 100 ms (--no-fold: the transport's)", h, plain, _held(plain, lambda x: x < 0.1),
            f"{plain * 1e3:.0f} ms")
        window = logs_section.FOLD_WINDOW
        add(f"folded live view (the default from {logs_section.FOLD_AT} ranks): delay p50 within the fold's "
            f"{window * 1e3:.0f} ms", h, p50, _held(p50, lambda x, w=window: x <= w),
            "" if p50 is None else f"{p50 * 1e3:.0f} ms")


def teardown_targets(summary: Dict, add) -> None:
    """The targets for stopping a run (bench/sections/teardown.py), each through add."""
    for h in _sizes(summary, "teardown"):
        for m, what in (("crash", "first failure"), ("stop", "`clusterrun stop`")):
            t = get(summary, "teardown", h, m, "time")
            g = get(summary, "teardown", h, m, "grace_used") or 0.0
            add(f"teardown from {what} ≤ 1 s + grace used", h, t, _held(t, lambda v, g=g: v <= 1.0 + g),
                "" if t is None else f"{t:.2f} s (grace used {g:.2f} s)")
            left = get(summary, "teardown", h, m, "left_processes", "max")
            if left is not None:
                add(f"teardown ({m}): no process left", h, left, left == 0, f"{left:.0f}")


def restarts_targets(summary: Dict, add) -> None:
    """The targets for job.restarts (bench/sections/restarts.py: grace 2 s, host_lost 5 s), each through add."""
    for h in _sizes(summary, "restarts"):
        t = get(summary, "restarts", h, "clusterrun", "time")
        add("failed rank → new attempt's first step ≤ grace + 3 s", h, t, _held(t, lambda v: v <= 2 + 3),
            _seconds(t))
        r = get(summary, "restarts", h, "ratio", "clusterrun/torchrun")
        add("… against torchrun restarting its own workers (same job)", h, r, None, tables.times(r))
        t = get(summary, "restarts", h, "clusterrun-host", "time")
        add("lost host → new attempt's first step ≤ host_lost + grace + 5 s", h, t,
            _held(t, lambda v: v <= 5 + 2 + 5), _seconds(t))


def stacks_targets(summary: Dict, add) -> None:
    """Issue 22's target for `clusterrun stacks` (bench/sections/stacks.py), through add."""
    for h in _sizes(summary, "stacks"):
        t = get(summary, "stacks", h, "clusterrun stacks", "time")
        add("`clusterrun stacks` ≤ 2 s" + (" (the bound is for 16 hosts)" if int(h) < 16 else ""), h, t,
            _held(t, lambda v: v <= 2.0), _seconds(t))


def training_targets(summary: Dict, add) -> None:
    """The target for training speed (bench/sections/training.py), through add."""
    for h in _sizes(summary, "training"):
        # paired: each repetition's clusterrun run against the by-hand run next to it (cancels the
        # machine's drift, which on this shared machine moves samples/s by 2x between minutes)
        r = get(summary, "training", h, "ratio", "clusterrun/by-hand")
        add("training ≥ 98% of by hand", h, r, _held(r, lambda v: v >= 0.98),
            "" if r is None else f"{100 * r:.1f}%")


def claims_targets(summary: Dict, add) -> None:
    """Issue 25's targets for claiming shared hosts (bench/sections/claims.py), each through add."""
    for h in _sizes(summary, "claims"):
        r = get(summary, "claims", h, "ratio", "claims/no-claims")
        add("claiming the hosts adds ≤ 10% to a launch (claims on ÷ off, paired)", h, r,
            _held(r, lambda v: v <= 1.1), tables.times(r))
        r = get(summary, "claims", h, "ratio", "cpu claims/no-claims")
        add("… and ≤ 10% CPU (controller + hosts)", h, r, _held(r, lambda v: v <= 1.1), tables.times(r))
        t = get(summary, "claims", h, "handover", "time")
        add("a waiting launch runs ≤ 2 s after the holder was stopped", h, t, _held(t, lambda v: v <= 2.0),
            _seconds(t))


def attached_targets(summary: Dict, add) -> None:
    """Issue 26's targets for the attached launch (bench/sections/attached.py), each through add."""
    sizes = sorted(summary.get("attached", {}), key=int)
    for h in sizes:
        pr = lambda name, h=h: get(summary, "attached", h, "ratio", name)  # noqa: E731
        at = int(h) in (3, 16)
        r = pr("clusterrun/floor")
        add("attached launch ≤ 1.5× the whole-process floor" + ("" if at else " (the target is at 3 and 16 hosts)"),
            h, r, None if r is None or not at else r <= 1.5, tables.times(r))
        r = pr("ssh-serial/clusterrun")
        add("attached launch faster than the serial ssh loop (from 2 hosts on)", h, r,
            None if r is None or int(h) < 2 else r > 1.0, tables.times(r) + " faster" if r else "")
        r = pr("cpu clusterrun/floor")
        add("CPU per launch (controller + hosts) ≤ 1.5× the whole-process floor's", h, r,
            None if r is None else r <= 1.5, tables.times(r))
    grown = [h for h in sizes if int(h) > 16]
    if "16" in sizes and grown:
        top = grown[-1]
        growth = {m: _growth(summary, m, "16", top) for m in ("clusterrun", "floor")}
        if None not in growth.values():
            add(f"attached launch grows from 16 to {top} hosts no more than the floor does", int(top),
                growth["clusterrun"], growth["clusterrun"] <= growth["floor"],
                f"×{growth['clusterrun']:.2f} (floor ×{growth['floor']:.2f})")


def _growth(summary: Dict, method: str, small: str, large: str) -> Optional[float]:
    a, b = get(summary, "attached", small, method, "time"), get(summary, "attached", large, method, "time")
    return None if not a or b is None else b / a


def plot(summary: Dict, path: Path) -> bool:
    """Launch and push time versus hosts, clusterrun and the baselines (median, min-max bars)."""
    plt = plotting.pyplot()
    panels = [("attached", "Attached launch of a job that exits at once: command → end",
               [("clusterrun", "clusterrun launch"), ("floor", "whole-process floor (paramiko)"),
                ("ssh-serial", "serial ssh loop"), ("pdsh", "pdsh")]),
              ("launch", "Launch --detach: command → all ranks running",
               [("clusterrun", "clusterrun"), ("floor", "floor (paramiko connect + true)"),
                ("ssh-serial", "serial ssh loop"), ("pdsh", "pdsh")]),
              ("push", "Push: 100 MB + 1,000 files to every host",
               [("clusterrun", "clusterrun (first push)"), ("clusterrun-unchanged", "clusterrun (unchanged)"),
                ("scp", "scp -r"), ("rsync", "rsync -a"), ("sftp", "paramiko SFTP"), ("floor", "floor")])]
    panels = [p for p in panels if summary.get(p[0])]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.4), squeeze=False)
    for ax, (sec, title, methods) in zip(axes[0], panels):
        hosts = sorted(summary[sec], key=int)
        for method, label in methods:
            xs, ys, lo, hi = [], [], [], []
            for h in hosts:
                cell = summary[sec][h].get(method, {}).get("time")
                if cell:
                    xs.append(int(h))
                    ys.append(cell["median"])
                    lo.append(cell["median"] - cell["min"])
                    hi.append(cell["max"] - cell["median"])
            if xs:
                style = dict(lw=2.5, zorder=3) if method == "clusterrun" else dict(lw=1.3)
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label, **style)
        plotting.finish_axes(ax, title, "seconds (median, min–max)", [int(h) for h in hosts])
    return plotting.save(fig, path)


DOCS_HEAD = """<!-- Generated by `python -m bench.report {results} --docs` from a benchmark run: edit bench/. -->
# Benchmarks

How to reproduce: [bench/README.md](../bench/README.md). The plot: launch (attached and detached) and push
time versus hosts.
The relay push with the controller's link capped has its own page: [bench-relay.md](bench-relay.md); every
command at 64 and 128 hosts, round after round, has its own: [bench-scale.md](bench-scale.md); each host's
CPU of a launch, by process, has its own: [bench-hostcpu.md](bench-hostcpu.md).

![launch and push time versus hosts](bench.png)

"""


RELAY_HEAD = """<!-- Generated by `python -m bench.report {results} --docs` from a benchmark run: edit bench/. -->
# Benchmark: relay push with the controller's link capped

How to reproduce: `{command}` (bench/sections/relay.py). {notes}

![push time versus hosts under a capped controller link](bench-relay.png)

"""


SCALE_HEAD = """<!-- Generated by `python -m bench.report {results} --docs` from a benchmark run: edit bench/. -->
# Benchmark: every command at 64 and 128 hosts

How to reproduce: the command below (bench/sections/scale.py; bench/README.md says what each round checks).
{meta}
"""


HOSTCPU_HEAD = """<!-- Generated by `python -m bench.report {results} --docs` from a benchmark run: edit bench/. -->
# Benchmark: each host's CPU of an attached launch, by process

How to reproduce: the command below (bench/sections/hostcpu.py; bench/README.md says how each process is
measured). {meta}
"""


def render(results_dir: Path, docs: bool = False) -> None:
    data = json.loads((results_dir / "results.json").read_text())
    data["summary"] = summarize(data["samples"])
    data["targets"] = evaluate(data["summary"])
    (results_dir / "results.json").write_text(json.dumps(data, indent=1))
    md = tables.markdown(data)
    (results_dir / "results.md").write_text(md)
    has_plot = plot(data["summary"], results_dir / "plot.png")
    rel = results_dir.relative_to(REPO) if results_dir.is_relative_to(REPO) else results_dir
    _relay_page(data, results_dir, rel, docs)  # its own page: a relay-only run leaves docs/bench.md as it is
    if "scale" in data["summary"] and docs:  # its own page too: a run of its own (64 and 128 hosts)
        _scale_page(data, rel)
    if "hostcpu" in data["summary"] and docs:  # and this one: a run of its own at a few sizes
        (REPO / "docs" / "bench-hostcpu.md").write_text(
            HOSTCPU_HEAD.format(results=rel, meta=tables.meta_line(data["meta"]))
            + "\n".join(tables.hostcpu(tables.View(data["summary"], data["meta"].get("versus")))[1:]) + "\n")
    if not set(data["summary"]) - {"relay", "scale", "hostcpu"} or not docs:
        return
    (REPO / "docs").mkdir(exist_ok=True)
    body = md.split("\n", 1)[1]  # the title line is replaced by the docs header
    (REPO / "docs" / "bench.md").write_text(DOCS_HEAD.format(results=rel) + body.lstrip("\n"))
    if has_plot:
        shutil.copy(results_dir / "plot.png", REPO / "docs" / "bench.png")


def _relay_page(data: dict, results_dir: Path, rel: Path, docs: bool) -> None:
    relay_md = relay.markdown(data["summary"])
    if not relay_md:
        return
    (results_dir / "relay.md").write_text(relay_md)
    relay_plot = relay.plot(data["summary"], results_dir / "relay.png")
    if docs:
        notes = sorted({n["text"] for n in data.get("notes", []) if n["section"] == "relay"})
        (REPO / "docs" / "bench-relay.md").write_text(RELAY_HEAD.format(
            results=rel, command=data["meta"].get("command", ""), notes=" ".join(n[0].upper() + n[1:] + "." for n in notes))
            + relay_md.split("\n", 1)[1])
        if relay_plot:
            shutil.copy(results_dir / "relay.png", REPO / "docs" / "bench-relay.png")


def _scale_page(data: dict, rel: Path) -> None:
    notes = [f"- {n['hosts']} hosts: {n['text']}" for n in data.get("notes", []) if n["section"] == "scale"]
    (REPO / "docs" / "bench-scale.md").write_text(
        SCALE_HEAD.format(results=rel, meta=tables.meta_line(data["meta"]))
        + "\n".join(tables.scale(tables.View(data["summary"]))[1:]) + "\n"
        + ("\n## Notes\n\n" + "\n".join(notes) + "\n" if notes else ""))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Re-render a benchmark run's tables, targets and plot.")
    p.add_argument("results", type=Path, help="bench/results/<stamp>")
    p.add_argument("--docs", action="store_true", help="also write docs/bench.md and docs/bench.png")
    a = p.parse_args(argv)
    render(a.results.resolve(), docs=a.docs)
    print((a.results / "results.md").read_text())


if __name__ == "__main__":
    main()
