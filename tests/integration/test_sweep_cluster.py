"""clusterrun sweep on the container cluster: a small grid of real training runs, results, resuming."""

import csv
from pathlib import Path

import pytest

from faultkit import FAST

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
JOB = {"root": str(REPO), "script": "train_job/train.py", "sync": ["train_job/"], "timeout": "60s",
       "args": ["--epochs", "1", "--synthetic", "--data-dir", "data", "--log-every", "1000"]}


def test_a_grid_of_runs_gives_results_and_plots_and_resumes(cr, tmp_path):
    inv = cr.inventory(job=JOB, top={"timeouts": FAST})
    out = tmp_path / "sweep"
    argv = ["sweep", inv, "--nodes", "1,2", "--batch-size", "32", "--init-method", "tcp,file",
            "--data-size", "256", "--out", out]
    done = cr.run(*argv, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "results.csv") as fh:
        table = list(csv.DictReader(fh))
    assert sorted(r["point"] for r in table) == ["n1-b32-file-d256-r0", "n1-b32-tcp-d256-r0",
                                                 "n2-b32-file-d256-r0", "n2-b32-tcp-d256-r0"]
    assert all(r["status"] == "succeeded" and float(r["samples_per_s"]) > 0 for r in table)
    assert {r["ranks"] for r in table if r["nodes"] == "2"} == {"2"}
    assert all(float(r["speedup"]) == 1.0 for r in table if r["nodes"] == "1")
    for png in ("time_vs_nodes.png", "time_vs_batch_size.png", "time_per_init_method.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    runs = cr.ps()
    assert {r["id"] for r in runs} == {r["run_id"] for r in table}  # ordinary runs in the registry
    again = cr.run(*argv, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count(": skipped") == 4 and len(cr.ps()) == 4  # nothing ran twice


def test_a_failed_point_is_recorded_and_the_sweep_goes_on(cr, tmp_path):
    inv = cr.inventory(job=JOB, top={"timeouts": FAST})
    out = tmp_path / "sweep"
    done = cr.run("sweep", inv, "--nodes", "1", "--batch-size", "0,32", "--data-size", "128", "--out", out,
                  timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    with open(out / "results.csv") as fh:
        table = {r["point"]: r for r in csv.DictReader(fh)}
    assert table["n1-b0-env-d128-r0"]["status"] == "failed" and "exit code" in table["n1-b0-env-d128-r0"]["reason"]
    assert table["n1-b32-env-d128-r0"]["status"] == "succeeded"
