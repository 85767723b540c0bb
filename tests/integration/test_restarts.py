"""job.restarts over real SSH on the container cluster: a killed rank comes back from its checkpoint, a lost
host is dropped (the world shrinks, rank 0's host moves), restarts run out. Each test prints the time from
the fault to the new attempt's first step (the figure the README and the closing note quote)."""

import json
import re
import time
from pathlib import Path

import pytest

from faultkit import FAST, all_stepping
from support import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["--epochs", "3", "--synthetic", "--data-dir", "data", "--data-size", "4000", "--batch-size", "32",
         "--log-every", "1"]
STEPS = ["--steps", "50", "--step-time", "0.1"]


def train_inventory(cr, name, **job):
    return cr.inventory(name, job={"root": str(REPO), "script": "train_job/train.py", "sync": ["train_job/"],
                                   "args": TRAIN, "timeout": "60s", **job}, top={"timeouts": FAST})


def local_log(cr, run_id, rank, attempt=1):
    folder = Path(cr.env["CLUSTERRUN_HOME"]) / "runs" / run_id / (f"attempt-{attempt}" if attempt > 1 else "")
    path = folder / f"rank-{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def rank_pid(cluster, host, run_id, rank):
    rc, out, _ = cluster.exec(host, ["cat", f".clusterrun/runs/{run_id}/state.json"])
    assert rc == 0, out
    return json.loads(out)["ranks"][str(rank)]["pid"]


def metrics(cluster, run_id):
    rc, out, _ = cluster.exec("node0", ["cat", f".clusterrun/runs/{run_id}/job/out/metrics.json"])
    assert rc == 0, out
    return json.loads(out)


def test_a_rank_killed_in_epoch_2_resumes_from_the_epoch_1_checkpoint(cr, cluster):
    plain = cr.run("launch", train_inventory(cr, "plain.yaml"), timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    baseline = metrics(cluster, cr.ps()[0]["id"])["test_accuracy"]

    proc = cr.popen("launch", train_inventory(cr, "faulty.yaml", restarts=1, restart_delay="1s"))
    try:
        run_id = wait_for(lambda: len(cr.ps()) == 2 and cr.ps()[0]["id"], timeout=60, what="the run's record")
        wait_for(lambda: "epoch 2 step 3/" in local_log(cr, run_id, 2), timeout=300, what="rank 2 in epoch 2")
        rc, out, _ = cluster.exec("node2", ["kill", "-KILL", str(rank_pid(cluster, "node2", run_id, 2))])
        assert rc == 0, out
        t_fault = time.monotonic()
        wait_for(lambda: "epoch 2 step 1/" in local_log(cr, run_id, 0, attempt=2), timeout=120,
                 what="the new attempt's first step")
        took = time.monotonic() - t_fault
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            cr.run("stop")
    print(f"\nkilled rank -> first step of attempt 2: {took:.1f} s (grace 2 s, restart delay 1 s)")
    assert proc.returncode == 0, err[-3000:]
    assert "attempt 2/2 on 4 hosts in 1 s" in err
    assert "rank 2 on node2: killed by signal 9 (SIGKILL)" in err  # the attempts table
    resumed = local_log(cr, run_id, 0, attempt=2)
    assert "resuming from the epoch 1 checkpoint" in resumed and "epoch 1 step" not in resumed
    run = cr.ps()[0]
    assert run["attempt"] == 2 and [a["reason"] for a in run["attempts"]] == \
        ["rank 2 on node2: killed by signal 9 (SIGKILL)"]
    accuracy = metrics(cluster, run_id)["test_accuracy"]
    print(f"held-out accuracy: {accuracy:.4f} after the restart, {baseline:.4f} without the fault")
    assert abs(accuracy - baseline) <= 0.02
    assert took < 2 + 3 + 1 + 10  # grace + 3 s + the delay, and this busy 2-core machine's slack


@pytest.mark.parametrize("lost, master", [("node3", "node0"), ("node0", "node1")])
def test_a_lost_host_is_dropped_and_the_run_goes_on_with_the_rest(cr, cluster, lost, master):
    inv = cr.inventory(job={"args": STEPS, "restarts": 1, "min_nodes": 3, "restart_delay": "0s"},
                       top={"timeouts": FAST})
    proc = cr.popen("launch", inv)
    wait_for(lambda: cr.ps() and all_stepping(cr), timeout=120, what="every rank stepping")
    run_id = cr.ps()[0]["id"]
    cluster.crash(lost)
    t_fault = time.monotonic()
    try:
        wait_for(lambda: "rank 0 step 0" in local_log(cr, run_id, 0, attempt=2), timeout=120,
                 what="the new attempt's first step")
        took = time.monotonic() - t_fault
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.start(lost)
    print(f"\n{lost} crashed -> first step of attempt 2: {took:.1f} s (host_lost 5 s, grace 2 s)")
    assert proc.returncode == 0, err[-3000:]
    assert f"attempt 2/2 on 3 hosts ({lost} dropped: host lost)" in err
    run = cr.ps()[0]
    assert run["state"] == "succeeded" and len(run["ranks"]) == 3
    assert [h["name"] for h in run["hosts"] if h["state"] == "lost"] == [lost]
    rank0 = local_log(cr, run_id, 0, attempt=2)
    assert re.search(rf"worker rank 0/3 on {master}\b", rank0), rank0[:500]  # MASTER_ADDR is rank 0's host's
    assert run["attempts"][0]["world_size"] == 4 and run["attempts"][0]["dropped"] == []
    assert took < 5 + 2 + 5 + 8  # host_lost + grace + 5 s, and this busy 2-core machine's slack


def test_restarts_exhausted_exit_1_and_list_every_attempts_cause(cr):
    inv = cr.inventory(job={"args": ["--steps", "30", "--step-time", "0.05", "--crash-rank", "2", "--crash-at", "3"],
                            "restarts": 1, "restart_delay": "0s"}, top={"timeouts": FAST})
    done = cr.run("launch", inv)
    assert done.returncode == 1, done.stderr
    assert "no restart left: 2 attempts made (job.restarts: 1)" in done.stderr
    rows = re.findall(r"^│ (\d) .*rank 2 on node2: exit code 7", done.stderr, re.M)
    assert rows == ["1", "2"], done.stderr
    run = cr.ps()[0]
    assert run["state"] == "failed" and run["exit_code"] == 1 and run["attempt"] == 2
