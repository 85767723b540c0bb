"""clusterrun launch over real SSH on the container cluster: training end to end, incremental push,
first-failure teardown, detached runs, and runs whose controller was killed."""

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from clusterkit import JOBS
from support import wait_for, write_tree

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_four_hosts_train_the_example_job_and_agree(cr, cluster):
    inv = cr.inventory(job={"root": str(REPO), "script": "train_job/train.py", "sync": ["train_job/"],
                            "args": ["--epochs", "1", "--synthetic", "--data-dir", "data", "--data-size", "1200",
                                     "--batch-size", "32"]})
    done = cr.run("launch", inv, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    digests = re.findall(r"^\[node(\d) r(\d)\] params sha256=([0-9a-f]{64})$", done.stdout, re.M)
    assert sorted((n, r) for n, r, _ in digests) == [("0", "0"), ("1", "1"), ("2", "2"), ("3", "3")]
    assert len({d for _, _, d in digests}) == 1  # bit-identical parameters on every host
    (run,) = cr.ps()
    assert run["state"] == "succeeded" and [r["state"] for r in run["ranks"]] == ["succeeded"] * 4
    rc, out, _ = cluster.exec("node0", ["cat", f".clusterrun/runs/{run['id']}/job/out/metrics.json"])
    metrics = json.loads(out)
    assert metrics["world_size"] == 4 and metrics["backend"] == "gloo"
    home = Path(cr.env["CLUSTERRUN_HOME"])
    assert "params sha256" in (home / "runs" / run["id"] / "rank-3.log").read_text()


def test_an_unchanged_relaunch_pushes_nothing(cr, tmp_path):
    root = write_tree(tmp_path / "project", {"worker.py": (JOBS / "worker.py").read_bytes(),
                                             "data/blob.bin": os.urandom(2 << 20)})  # content no host has seen
    inv = cr.inventory(job={"root": str(root), "args": ["--no-dist", "--steps", "1"], "sync": ["data/"]})
    first = cr.run("launch", inv)
    assert first.returncode == 0, first.stderr
    second = cr.run("launch", inv)
    assert second.returncode == 0, second.stderr
    newest, oldest = cr.ps()
    assert all(h["pushed_bytes"] >= 2 << 20 for h in oldest["hosts"])
    assert [h["pushed_bytes"] for h in newest["hosts"]] == [0, 0, 0, 0]
    (root / "data" / "blob.bin").write_bytes(os.urandom(1000))  # a change sends only what changed
    third = cr.run("launch", inv)
    assert third.returncode == 0, third.stderr
    assert [h["pushed_bytes"] for h in cr.ps()[0]["hosts"]] == [1000] * 4


@pytest.mark.parametrize("mode, expected", [("exit", "exit code 7"), ("segv", "killed by signal 11 (SIGSEGV)"),
                                            ("kill", "killed by signal 9 (SIGKILL)")])
def test_a_crashing_rank_brings_the_whole_job_down(cr, cluster, mode, expected):
    inv = cr.inventory(job={"args": ["--steps", "200", "--step-time", "0.1", "--crash-rank", "2",
                                     "--crash-at", "5", "--crash-mode", mode]})
    t = time.monotonic()
    done = cr.run("launch", inv)
    took = time.monotonic() - t
    assert done.returncode == 1, done.stderr
    assert "Root cause (first observed failure)" in done.stderr
    assert f"rank 2 on node2: {expected}" in done.stderr
    assert f"[node2 r2] rank 2 crashing at step 5 ({mode})" in done.stdout
    assert took < 60
    (run,) = cr.ps()
    assert run["state"] == "failed"
    assert {r["rank"]: r["state"] for r in run["ranks"]}[2] == "failed"
    # the autouse guard fails the test if any process of the run is left on any host


def test_detach_then_ps_logs_follow_and_stop(cr):
    inv = cr.inventory(job={"args": ["--steps", "10000", "--step-time", "0.2"]})
    done = cr.run("launch", "--detach", inv)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", run_id)
    (run,) = cr.ps()
    assert run["id"] == run_id and run["state"] == "running"
    wait_for(lambda: "rank 3 step 2" in cr.run("logs", run_id[:15]).stdout)
    follow = cr.popen("logs", "-f", "--rank", "1")
    time.sleep(3)
    stop = cr.run("stop", run_id, "--grace", "2")
    assert stop.returncode == 0, stop.stderr
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 1, err  # the run's exit code: stopped (as `ps` records it)
    assert f"run {run_id}: stopped" in err and "stopped by `clusterrun stop` (SIGTERM)" in err  # the summary
    lines = [ln for ln in out.splitlines() if ln.startswith("[node1 r1] rank 1 step")]
    steps = [int(ln.rsplit(" ", 1)[1]) for ln in lines]
    assert steps == list(range(len(steps))) and len(steps) > 5  # in order, none missing, none twice
    assert not any(ln.startswith("[node0") for ln in out.splitlines())
    (run,) = cr.ps()
    assert run["state"] == "stopped" and {r["state"] for r in run["ranks"]} == {"stopped"}
    again = cr.run("stop", run_id)
    assert again.returncode == 0


def test_controller_killed_mid_run_then_logs_and_stop_still_work(cr, cluster):
    inv = cr.inventory(job={"args": ["--steps", "10000", "--step-time", "0.2"]})
    proc = cr.popen("launch", inv)
    wait_for(lambda: cr.ps() and cr.ps()[0]["state"] == "running", timeout=90)
    wait_for(lambda: "[node3 r3] rank 3 step 3" in cr.run("logs", "--rank", "3").stdout)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    (run,) = cr.ps()
    assert run["state"] == "running"  # the ranks outlive the controller
    time.sleep(1)
    logs = cr.run("logs", "--tail", "1")
    assert logs.returncode == 0
    last = {ln.split("]")[0] + "]": int(ln.rsplit(" ", 1)[1]) for ln in logs.stdout.splitlines()}
    assert set(last) == {"[node0 r0]", "[node1 r1]", "[node2 r2]", "[node3 r3]"} and min(last.values()) > 3
    stop = cr.run("stop")
    assert stop.returncode == 0, stop.stderr
    (run,) = cr.ps()
    assert run["state"] == "stopped"
    assert cluster.orphans() == []


def test_connect_failures_name_every_host_and_start_nothing(cr, cluster):
    before = {h: cr.run_dirs(h) for h in ("node0", "node1")}
    cluster.crash("node2")
    inv = cr.inventory(edit_hosts=lambda hosts: hosts[3].update(port=2222))
    done = cr.run("launch", inv)
    assert done.returncode == 3, done.stderr
    assert "connect failed on 2 hosts; nothing was started" in done.stderr
    assert "node2: unreachable" in done.stderr and "node3: unreachable" in done.stderr
    assert {h: cr.run_dirs(h) for h in ("node0", "node1")} == before
