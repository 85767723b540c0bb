"""The sweep's pure parts: the grid, per-point inventories, speed-up rows, and resuming from sweep.json."""

import json

import pytest

from clusterrun.sweep import grid as sw
from clusterrun.errors import UsageError
from clusterrun.config.inventory import parse_inventory
from clusterrun.sweep.report import plot, rows, write_tables

INV = parse_inventory("version: 1\nhosts: [{host: a}, {host: b, slots: 2}, {host: c}]\n"
                      "job: {script: t.py, args: [--epochs, '1'], shared_dir: /shared}\n", "/p/inv.yaml")


def test_grid_covers_every_combination_with_repeats_last():
    points = sw.grid([1, 2], [32, 64], ["tcp", "file"], [None], repeat=2)
    assert len(points) == 16 and len({p.key for p in points}) == 16
    assert [p.repeat for p in points[:8]] == [0] * 8  # the whole grid once before any repeat
    assert points[0].key == "n1-b32-tcp-r0"


def test_point_inventory_takes_the_first_hosts_and_sets_the_flags():
    p = sw.Point(nodes=2, batch_size=128, init_method="file", data_size=500, repeat=0)
    inv = sw.point_inventory(INV, p, ["--epochs", "1"])
    assert [h.host for h in inv.hosts] == ["a", "b"]
    assert inv.job.init_method == "file"
    assert inv.job.args == ("--epochs", "1", "--batch-size", "128", "--data-size", "500")


def test_grid_is_checked_against_the_inventory():
    with pytest.raises(UsageError, match="only 3 hosts"):
        sw.check_grid(INV, [1, 4], ["tcp"])
    with pytest.raises(UsageError, match="choose from"):
        sw.check_grid(INV, [1], ["mpi"])


def metrics(world, train_s, loss=0.1):
    return {"world_size": world, "train_wall_s": train_s, "samples_per_s": 1000 / train_s,
            "final_train_loss": loss, "test_accuracy": 0.9, "data": {"train_samples": 1000}}


def test_rows_compute_speedup_and_efficiency_against_the_fewest_nodes():
    entries = [
        {"point": {"nodes": 1, "batch_size": 64, "init_method": "tcp", "data_size": None, "repeat": 0},
         "status": "succeeded", "run_id": "r1", "seconds": 12, "metrics": metrics(1, 10.0)},
        {"point": {"nodes": 2, "batch_size": 64, "init_method": "tcp", "data_size": None, "repeat": 0},
         "status": "succeeded", "run_id": "r2", "seconds": 8, "metrics": metrics(2, 6.0)},
        {"point": {"nodes": 4, "batch_size": 64, "init_method": "tcp", "data_size": None, "repeat": 0},
         "status": "failed", "run_id": "r3", "seconds": 3, "metrics": None, "reason": "rank 2 on c: exit code 1"},
    ]
    table = rows(entries)
    assert table[1]["speedup"] == pytest.approx(10 / 6) and table[1]["efficiency"] == pytest.approx(10 / 6 / 2)
    assert table[0]["speedup"] == 1.0
    assert table[2]["status"] == "failed" and table[2]["speedup"] is None and "exit code 1" in table[2]["reason"]


def test_write_tables_and_plots(tmp_path):
    entries = [{"point": {"nodes": n, "batch_size": b, "init_method": m, "data_size": None, "repeat": 0},
                "status": "succeeded", "run_id": f"r{n}{b}{m}", "seconds": 5, "metrics": metrics(n, 10.0 / n)}
               for n in (1, 2) for b in (32, 64) for m in ("tcp", "file")]
    table = rows(entries)
    files = write_tables(str(tmp_path), table) + plot(str(tmp_path), table, note="test")
    assert [f.rsplit("/", 1)[1] for f in files] == ["results.csv", "results.json", "time_vs_nodes.png",
                                                    "time_vs_batch_size.png", "time_per_init_method.png"]
    assert (tmp_path / "time_vs_nodes.png").read_bytes()[:4] == b"\x89PNG"
    assert len(json.loads((tmp_path / "results.json").read_text())) == 8


def test_a_resumed_sweep_skips_what_is_done_and_retries_what_failed(tmp_path):
    points = sw.grid([1, 2], [64], ["tcp"], [None], repeat=1)
    ident = sw.sweep_id(INV, points, [])
    calls = []

    def run_point(point, inv):
        calls.append(point.key)
        ok = not (point.nodes == 2 and len(calls) < 3)
        return sw.PointResult("run-" + point.key, "succeeded" if ok else "failed", 0 if ok else 1,
                              "" if ok else "boom", 1.0, metrics(point.nodes, 1.0) if ok else None)

    events = []
    state = sw.SweepState(str(tmp_path), ident, points)
    assert sw.run_sweep(INV, points, [], state, run_point, events.append)
    assert calls == ["n1-b64-tcp-r0", "n2-b64-tcp-r0"]
    again = sw.SweepState(str(tmp_path), ident, points)  # a new process, from sweep.json
    sw.run_sweep(INV, points, [], again, run_point, events.append)
    assert calls == ["n1-b64-tcp-r0", "n2-b64-tcp-r0", "n2-b64-tcp-r0"]
    assert [e.status for e in events if e.status != "starting"] == ["succeeded", "failed", "skipped", "succeeded"]
    with pytest.raises(UsageError, match="another sweep"):
        sw.SweepState(str(tmp_path), "different", points)


def test_fail_fast_stops_at_the_first_failure(tmp_path):
    points = sw.grid([1, 2, 3], [64], ["tcp"], [None], repeat=1)
    state = sw.SweepState(str(tmp_path), "x", points)
    ran = []

    def run_point(point, inv):
        ran.append(point.key)
        return sw.PointResult("", "failed", 1, "boom", 1.0, None)

    assert not sw.run_sweep(INV, points, [], state, run_point, lambda e: None, fail_fast=True)
    assert ran == ["n1-b64-tcp-r0"]
