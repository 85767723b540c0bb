"""A sweep's results: one row per run (CSV and JSON), speed-up against the fewest nodes, and PNG plots."""

from __future__ import annotations

import csv
import json
import os
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

FIELDS = ("point", "status", "run_id", "nodes", "ranks", "batch_size", "init_method", "data_size", "repeat",
          "wall_s", "train_s", "samples_per_s", "speedup", "efficiency", "final_loss", "test_accuracy", "reason")


def _median(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rows(entries: Sequence[dict]) -> List[dict]:
    """Rows with speed-up and parallel efficiency against the fewest nodes of the same batch size, init
    method and data size (median over repeats): 1 node when the sweep has it."""
    out = [_row(e) for e in entries]
    groups: Dict[Tuple, List[dict]] = {}
    for r in out:
        if r["status"] == "succeeded":
            groups.setdefault((r["batch_size"], r["init_method"], r["data_size"]), []).append(r)
    for group in groups.values():
        _add_speedups(group)
    return out


def _row(e: dict) -> dict:
    """One run's row, speed-up and efficiency still to come."""
    p, m = e["point"], e.get("metrics") or {}
    return {
        "point": f"n{p['nodes']}-b{p['batch_size']}-{p['init_method']}"
                 + (f"-d{p['data_size']}" if p.get("data_size") is not None else "") + f"-r{p['repeat']}",
        "status": e["status"], "run_id": e.get("run_id", ""), "nodes": p["nodes"],
        "ranks": m.get("world_size"), "batch_size": p["batch_size"], "init_method": p["init_method"],
        "data_size": p.get("data_size") if p.get("data_size") is not None else (m.get("data") or {}).get(
            "train_samples"),
        "repeat": p["repeat"], "wall_s": e.get("seconds"), "train_s": m.get("train_wall_s"),
        "samples_per_s": m.get("samples_per_s"), "speedup": None, "efficiency": None,
        "final_loss": m.get("final_train_loss"), "test_accuracy": m.get("test_accuracy"),
        "reason": e.get("reason", "") if e["status"] != "succeeded" else ""}


def _add_speedups(group: List[dict]) -> None:
    """Speed-up and efficiency of each succeeded row of one group against its fewest nodes."""
    fewest = min(r["nodes"] for r in group)
    base = _median([r["train_s"] for r in group if r["nodes"] == fewest])
    base_ranks = _median([r["ranks"] for r in group if r["nodes"] == fewest])
    for r in group:
        if base and r["train_s"]:
            r["speedup"] = base / r["train_s"]
            r["efficiency"] = r["speedup"] / (r["ranks"] / base_ranks) if r["ranks"] and base_ranks else None


def write_tables(folder: str, table: Sequence[dict]) -> List[str]:
    os.makedirs(folder, exist_ok=True)
    csv_path, json_path = os.path.join(folder, "results.csv"), os.path.join(folder, "results.json")
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for r in table:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})
    with open(json_path, "w") as fh:
        json.dump(list(table), fh, indent=2)
    return [csv_path, json_path]


def _series(table: Sequence[dict], x: str, line: str, where: Dict[str, object]) -> Dict[object, List[Tuple]]:
    """{line value: [(x, median train_s), ...]} over succeeded rows matching `where`."""
    cells: Dict[Tuple, List[float]] = {}
    for r in table:
        if r["status"] != "succeeded" or any(r[k] != v for k, v in where.items()):
            continue
        cells.setdefault((r[line], r[x]), []).append(r["train_s"])
    out: Dict[object, List[Tuple]] = {}
    for (ln, xv), values in sorted(cells.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        out.setdefault(ln, []).append((xv, _median(values)))
    return out


def plot(folder: str, table: Sequence[dict], note: str = "") -> List[str]:
    """Training time versus nodes, versus batch size (a line per data size), and per init method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in table if r["status"] == "succeeded"]
    if not done:
        return []
    paths = []
    biggest = max((r["data_size"] for r in done if r["data_size"] is not None), default=None)

    def save(fig, name: str, title: str) -> None:
        fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=9)
        fig.tight_layout()
        path = os.path.join(folder, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(6, 4))
    save(fig, "time_vs_nodes.png", _time_vs_nodes(ax, done, biggest))
    fig, ax = plt.subplots(figsize=(6, 4))
    save(fig, "time_vs_batch_size.png", _time_vs_batch_size(ax, done))
    fig, ax = plt.subplots(figsize=(6, 4))
    save(fig, "time_per_init_method.png", _time_per_init_method(ax, done, biggest))
    return paths


def _time_vs_nodes(ax, done: List[dict], biggest: Optional[int]) -> str:
    """A line per batch size; the plot's title."""
    first = done[0]
    where = {"init_method": first["init_method"], "data_size": biggest}  # the most data: the least noise
    for batch, pts in _series(done, "nodes", "batch_size", where).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"batch {batch}/rank")
    ax.set_xlabel("nodes")
    ax.set_ylabel("training time (s, median)")
    ax.set_xticks(sorted({r["nodes"] for r in done}))
    ax.legend()
    ax.grid(alpha=0.3)
    return f"training time vs nodes ({first['init_method']}://, {biggest} samples)"


def _time_vs_batch_size(ax, done: List[dict]) -> str:
    """A line per data size, on the most nodes; the plot's title."""
    most = max(r["nodes"] for r in done)
    where = {"nodes": most, "init_method": done[0]["init_method"]}
    for size, pts in _series(done, "batch_size", "data_size", where).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{size} samples")
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch_size"] for r in done})
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("batch size per rank")
    ax.set_ylabel("training time (s, median)")
    ax.legend()
    ax.grid(alpha=0.3)
    return f"training time vs batch size ({most} nodes)"


def _time_per_init_method(ax, done: List[dict], biggest: Optional[int]) -> str:
    """A group of bars per init method, a bar per node count; the plot's title."""
    batch = done[0]["batch_size"]
    methods = sorted({r["init_method"] for r in done})
    nodes = sorted({r["nodes"] for r in done})
    width = 0.8 / max(1, len(nodes))
    for i, n in enumerate(nodes):
        heights = [_median_time(done, n, m, batch, biggest) or 0 for m in methods]
        ax.bar([j + i * width for j in range(len(methods))], heights, width, label=f"{n} nodes")
    ax.set_xticks([j + width * (len(nodes) - 1) / 2 for j in range(len(methods))])
    ax.set_xticklabels([f"{m}://" for m in methods])
    ax.set_ylabel("training time (s, median)")
    ax.legend()
    return f"training time per init method (batch {batch}/rank, {biggest} samples)"


def _median_time(done: List[dict], nodes: int, method: str, batch: int, data_size: Optional[int]) -> Optional[float]:
    """The median training time of the runs at one point (None: none ran there)."""
    return _median([r["train_s"] for r in done if r["nodes"] == nodes and r["init_method"] == method
                    and r["batch_size"] == batch and r["data_size"] == data_size])
