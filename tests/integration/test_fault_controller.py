"""The controller killed (SIGKILL) or interrupted (Ctrl-C) in every phase: ps, logs and stop still work
afterwards, nothing is left behind, and the exit code says what happened."""

import os
import signal
import time

import pytest

from clusterkit import JOBS
from faultkit import FAST, WORK, all_stepping, check_invariants
from support import wait_for, write_tree

pytestmark = pytest.mark.integration

@pytest.fixture
def big_project(tmp_path):
    """A job root with 40 MB that no host has seen, so that the push takes a while."""
    return write_tree(tmp_path / "project", {"worker.py": (JOBS / "worker.py").read_bytes(),
                                             **{f"data/part{i}.bin": os.urandom(10 << 20) for i in range(4)}})


def run_dir_on(cr, host, run_id):
    return run_id in cr.run_dirs(host)


def newest_id(cr):
    runs = cr.ps()
    return runs[0]["id"] if runs else None


def started_on(cluster, host, run_id):
    rc, _, _ = cluster.exec(host, ["test", "-e", f"/home/cr/.clusterrun/runs/{run_id}/state.json"])
    return rc == 0


# ------------------------------------------------------------------ SIGKILL


def cached_objects(cluster, host):
    rc, out, err = cluster.exec(host, ["sh", "-c", "find ~/.clusterrun/cache/objects -type f ! -name '*.log' "
                                                   "2>/dev/null | wc -l"])
    assert rc == 0, err
    return int(out)


def test_sigkill_during_push_leaves_no_partial_run(cr, cluster, big_project):
    inv = cr.inventory(job={"root": str(big_project), "args": ["--steps", "1"], "sync": ["data/"]},
                       top={"timeouts": FAST})
    hosts = ("node0", "node1", "node2", "node3")
    before = {h: cached_objects(cluster, h) for h in hosts}
    proc = cr.popen("launch", inv)
    run_id = wait_for(lambda: newest_id(cr), what="the run record")
    wait_for(lambda: any(run_dir_on(cr, h, run_id) for h in ("node0", "node1")), what="the push to begin", every=0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    wait_for(lambda: not any(run_dir_on(cr, h, run_id) for h in ("node0", "node1", "node2", "node3")),
             timeout=20, what="the hosts to remove the partial run")
    run = cr.ps()[0]
    assert run["state"] == "failed" and {r["state"] for r in run["ranks"]} == {"not-started"}
    assert cr.run("stop").returncode == 0  # nothing to stop, and it says so without failing
    # the objects the push added are gone too: from hosts that were receiving, and from hosts that had it
    # all and were holding the channel for the start
    wait_for(lambda: {h: cached_objects(cluster, h) for h in hosts} == before, timeout=20,
             what="the objects this push added to be removed")


def test_sigkill_during_start_then_stop_cleans_up(cr, cluster):
    """node3 hangs (paused) just as rank 0's host has started, so its start is still in flight when the
    controller dies; afterwards the run is in one of two consistent states, and `stop` ends it either way."""
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST})
    proc = cr.popen("launch", inv)
    run_id = wait_for(lambda: newest_id(cr), what="the run record")
    wait_for(lambda: started_on(cluster, "node0", run_id), timeout=60, what="node0 to start", every=0.01)
    cluster.pause("node3")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    cluster.unpause("node3")
    time.sleep(3)
    run = cr.ps()[0]
    ranks = {r["host"]: r["state"] for r in run["ranks"]}
    if ranks["node3"] == "not-started":  # its start never arrived: what did start is marked for stop
        assert run["state"] == "failed" and "before node3 started" in run["reason"]
        assert "node0" in run["cleanup_pending"]
        assert cr.run_dirs("node3").count(run_id) == 0  # the held push was dropped with its channel
    else:  # it got its start before the controller died: the job runs on without the controller
        assert run["state"] == "running" and set(ranks.values()) == {"running"}
    stop = cr.run("stop")
    assert stop.returncode == 0, stop.stderr
    run = check_invariants(cr, cluster, followed=False)  # its controller died mid-start
    assert run["cleanup_pending"] == []


# ------------------------------------------------------------------ Ctrl-C


def interrupt_when(cr, inv, ready, *args):
    proc = cr.popen("launch", *args, inv)
    try:
        ready()
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        return proc.returncode, out, err, time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_during_connect_starts_nothing(cr, cluster):
    cluster.pause("node3")  # its connect waits for the 3 s timeout: time to press Ctrl-C
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST})
    before = cr.run_dirs("node0")
    code, _, err, took = interrupt_when(cr, inv, lambda: (wait_for(lambda: newest_id(cr)), time.sleep(0.5)))
    assert code == 130, err
    assert "interrupted" in err and took < 5
    assert cr.run_dirs("node0") == before
    assert cr.ps()[0]["state"] == "interrupted"


def test_ctrl_c_during_push_removes_the_partial_run(cr, cluster, big_project):
    inv = cr.inventory(job={"root": str(big_project), "args": ["--steps", "1"], "sync": ["data/"]},
                       top={"timeouts": FAST})
    hosts = ("node0", "node1", "node2", "node3")
    before = {h: cached_objects(cluster, h) for h in hosts}

    def pushing():
        run_id = wait_for(lambda: newest_id(cr))
        wait_for(lambda: run_dir_on(cr, "node0", run_id), what="the push", every=0.05)

    code, _, err, _ = interrupt_when(cr, inv, pushing)
    assert code == 130, err
    run_id = newest_id(cr)
    wait_for(lambda: not any(run_dir_on(cr, h, run_id) for h in ("node0", "node1", "node2", "node3")),
             timeout=20, what="the hosts to remove the partial run")
    assert cr.ps()[0]["state"] == "interrupted"
    wait_for(lambda: {h: cached_objects(cluster, h) for h in hosts} == before, timeout=20,
             what="the objects this push added to be removed")


def test_ctrl_c_during_start_stops_what_started(cr, cluster):
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST})

    def starting():
        run_id = wait_for(lambda: newest_id(cr))
        wait_for(lambda: started_on(cluster, "node0", run_id), timeout=60, what="node0 started", every=0.01)
        cluster.pause("node3")  # its start hangs until the command timeout: Ctrl-C lands in the start

    code, _, err, _ = interrupt_when(cr, inv, starting)
    cluster.unpause("node3")
    assert code == 130, err
    cr.run("stop")  # node3 may have received its start while paused: a stop finishes it
    check_invariants(cr, cluster, expect_state="interrupted", lost=("node3",))


def test_ctrl_c_during_run_stops_every_rank(cr, cluster):
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST})
    code, out, err, took = interrupt_when(cr, inv, lambda: wait_for(lambda: cr.ps() and all_stepping(cr),
                                                                     timeout=120))
    assert code == 130, err
    assert took < 2 + 5, took  # the grace, plus a little
    run = check_invariants(cr, cluster, expect_state="interrupted")
    assert {r["state"] for r in run["ranks"]} == {"stopped"}
