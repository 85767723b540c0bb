"""What a new user does in the first hour, over real SSH (issue 27): a second launch right after a
detached one, on the same master port, is told which clusterrun run holds it (also while that run's rank
0 is still starting) and leaves it running; a bare `stop` stops the run that is still going, not the
newer one that failed; `logs` of runs the hosts no longer keep answers at once from the local copy; and
`logs -f` of a detached run whose host Python has no torch ends with the root cause, the `python:` hint
and the run's exit code. One long run and two short ones serve every assertion."""

from __future__ import annotations

import time

import pytest

from faultkit import FAST, WORK, all_stepping
from support import wait_for

pytestmark = pytest.mark.integration
HOSTS = ("node0", "node1", "node2", "node3")


def timed(cr, *args):
    t = time.monotonic()
    done = cr.run(*args)
    return done, time.monotonic() - t


def by_id(cr, run_id):
    return next(r for r in cr.ps() if r["id"] == run_id)


def test_a_busy_port_a_bare_stop_and_logs_of_runs_the_hosts_no_longer_keep(cr, cluster):
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST})  # master port 29500, fixed
    started = cr.run("launch", "--detach", inv)
    assert started.returncode == 0, started.stderr
    running = started.stdout.split()[-1]

    # the same inventory again, at once: the first run's rank 0 is still importing torch (its port not yet
    # bound) or already listens; either way the port is its, and the second launch must not join its
    # rendezvous (its workers did, and both runs failed)
    second = cr.run("launch", inv)
    assert second.returncode == 1, second.stderr
    assert f"master port 29500 is in use on node0 by clusterrun run {running} (rank 0; " in second.stderr
    assert second.stderr.count("29500 is in use") == 1  # said once (it was a notice and the error)
    assert f"`clusterrun stop {running}` if that run should end" in second.stderr
    wait_for(lambda: all_stepping(cr, running), what="the first run training, untouched")
    failed = cr.ps()[0]
    assert failed["id"] != running and failed["state"] == "failed"

    logs, took = timed(cr, "logs", failed["id"])  # it never started a rank: nothing to ask any host for
    assert logs.returncode == 0 and "never started a rank" in logs.stderr and took < 5, (took, logs.stderr)

    stop = cr.run("stop")  # no RUN: the newest run that still runs, not the newest run (which failed)
    assert stop.returncode == 0, stop.stderr
    assert f"run {running}: stopped" in stop.stderr
    assert by_id(cr, running)["state"] == "stopped" and by_id(cr, failed["id"]) == failed
    again = cr.run("stop", failed["id"])
    assert again.returncode == 0 and "already ended (failed at" in again.stderr and by_id(cr, failed["id"]) == failed

    for host in HOSTS:  # as `clean` from another machine, or retention, leaves them: no folder on any host
        cluster.exec(host, ["rm", "-rf", f"/home/cr/.clusterrun/runs/{running}"])
    logs, took = timed(cr, "logs", running, "--tail", "1")
    assert logs.returncode == 0, logs.stderr
    assert all(f"[node{r} r{r}] rank {r} step" in logs.stdout for r in range(4))  # the local copy
    assert [line for line in logs.stderr.splitlines() if line.strip()] == [
        f"the hosts no longer keep run {running} (node0, node1, node2, node3: no such run on this host); showing "
        "the local copy of its logs"]
    assert took < 5, took  # was 15 s of retries per host, and a "garbled log stream" error


def test_logs_follow_of_a_detached_run_whose_host_python_has_no_torch(cr):
    inv = cr.inventory(hosts=2, defaults={"python": "/usr/bin/python3"}, top={"timeouts": FAST})  # Debian's: no torch
    started = cr.run("launch", "--detach", inv)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[-1]
    done = cr.run("logs", "-f", run_id)
    assert done.returncode == 1, done.stderr  # the run's exit code (was 0 whatever the end)
    assert "Root cause (first observed failure)" in done.stderr
    assert "ModuleNotFoundError: No module named 'torch'" in done.stderr  # its last lines
    assert "hint: the host's Python has no torch: set python: (under defaults:, or per host)" in done.stderr
    assert f"`clusterrun check {inv}` tests every host" in done.stderr
    assert f"run {run_id}: failed" in done.stderr and "exit 1 after" in done.stderr
