"""Hosts that crash, hang or get cut off mid-run; ports taken or unreachable. The job stops on every
reachable host within a bound, and `clusterrun stop` later finishes the ones that were unreachable."""

import time

import pytest

from faultkit import FAST, WORK, all_stepping, check_invariants
from support import wait_for

pytestmark = pytest.mark.integration

# host_lost (5 s) + the stop on the reachable hosts (grace 2 s) + start-up slack of a busy 2-core machine
BOUND_S = 5 + 2 + 8


def start_and_wait(cr):
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST})
    proc = cr.popen("launch", inv)
    wait_for(lambda: cr.ps() and all_stepping(cr), timeout=120, what="every rank stepping")
    return proc


@pytest.mark.parametrize("fault, heal", [("crash", "start"), ("pause", "unpause"), ("partition", "heal")])
def test_a_lost_host_stops_the_job_everywhere_else_and_stop_finishes_it_later(cr, cluster, fault, heal):
    proc = start_and_wait(cr)
    t = time.monotonic()
    getattr(cluster, fault)("node3")
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t
    print(f"\n{fault}: controller exited {took:.1f} s after the fault")
    assert proc.returncode == 1, err
    assert "node3: host lost" in err
    assert took < BOUND_S, f"{fault}: {took:.1f} s"
    run = cr.ps()[0]
    assert run["state"] == "failed" and run["cleanup_pending"] == ["node3"]
    assert {r["host"]: r["state"] for r in run["ranks"]}["node3"] == "lost"
    assert all(r["state"] in ("stopped", "failed") for r in run["ranks"] if r["host"] != "node3")
    assert cluster.orphans(["node0", "node1", "node2"]) == []  # stopped on every reachable host
    getattr(cluster, heal)("node3")
    stop = cr.run("stop")
    assert stop.returncode == 0, stop.stderr
    run = cr.ps()[0]
    assert run["cleanup_pending"] == []
    check_invariants(cr, cluster, expect_state="failed", lost=("node3",))  # its files outlive the crash


def test_stop_marks_an_unreachable_host_and_finishes_it_when_it_is_back(cr, cluster):
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST})
    assert cr.run("launch", "--detach", inv).returncode == 0
    wait_for(lambda: all_stepping(cr), timeout=120, what="every rank stepping")
    cluster.pause("node1")
    first = cr.run("stop")
    assert first.returncode == 3 and "node1: not stopped" in first.stderr
    assert cr.ps()[0]["cleanup_pending"] == ["node1"]
    cluster.unpause("node1")
    second = cr.run("stop")
    assert second.returncode == 0, second.stderr
    run = check_invariants(cr, cluster, followed=False)  # detached: nobody followed it
    assert run["cleanup_pending"] == []


def test_master_port_taken_is_refused_by_the_preflight_before_starting(cr, cluster, ssh):
    before = {h: cr.run_dirs(h) for h in ("node0", "node1", "node2", "node3")}
    holder = ssh("node0").spawn("/opt/venv/bin/python -c \"import socket,time; s=socket.socket(); "
                                "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('', 29500)); "
                                "s.listen(); print('holding', flush=True); time.sleep(300)\"")
    try:
        assert holder.readline().strip() == "holding"
        done = cr.run("launch", cr.inventory(job={"args": ["--steps", "3"]}, top={"timeouts": FAST}))
    finally:
        holder.kill()
    assert done.returncode == 1, done.stderr
    assert "preflight failed on 1 host; nothing was started" in done.stderr
    assert "master port 29500 is in use on node0" in done.stderr
    assert {r["state"] for r in cr.ps()[0]["ranks"]} == {"not-started"}
    time.sleep(1)  # the hosts drop what they received when their held channel closes
    assert {h: cr.run_dirs(h) for h in before} == before


def test_a_worker_that_cannot_reach_the_master_ends_the_job(cr, cluster):
    cluster.block("node2", "node0")
    inv = cr.inventory(job={"args": ["--steps", "3"], "timeout": "10s"}, top={"timeouts": FAST})
    t = time.monotonic()
    done = cr.run("launch", inv)
    took = time.monotonic() - t
    assert done.returncode == 1, done.stderr
    assert "Root cause" in done.stderr
    assert took < 10 + 30, took  # the rendezvous timeout handed to the job, plus start-up
    check_invariants(cr, cluster, expect_state="failed")
    # node2's supervisor could not join node0's (the block): node0's stays up for it until the join
    # timeout (timeouts.command + host_lost after its start), then ends by itself
    cluster.unblock("node2")
    wait_for(lambda: not cluster.orphans(["node0"]), timeout=30, what="node0's supervisor ended")
