"""Shared checks for the fault-matrix tests: the invariants that must hold after every case."""

from __future__ import annotations

import hashlib
from pathlib import Path

TERMINAL = {"succeeded", "failed", "stopped", "timed-out", "interrupted"}
RANK_END = {"succeeded", "failed", "stopped", "lost", "not-started"}
FAST = {"connect": "3s", "command": "15s", "host_lost": "5s", "grace": "2s"}
WORK = ["--steps", "100000", "--step-time", "0.1"]


def all_stepping(cr, run_id=None, ranks=4, step=2):
    """True once every rank printed `step N` (so all joined the group and are training)."""
    out = cr.run("logs", *( [run_id] if run_id else [])).stdout
    return all(f"rank {r} step {step}" in out for r in range(ranks))


def check_invariants(cr, cluster, *, expect_state=None, lost=(), gone=(), followed=True):
    """The run record is terminal; every rank ended somehow; every byte of every log is kept.

    Where a controller followed the run to its end (followed), the local copies of hosts that were never
    lost must already be whole as the live run left them (compared before anything fetches again); the
    copies of `lost` hosts (crashed, hung, cut off, then healed), and of every host of a run nobody
    followed, become whole once `clusterrun logs` catches up. `gone`: hosts whose files cannot be read."""
    run = cr.ps()[0]
    assert run["state"] in TERMINAL, run
    if expect_state:
        assert run["state"] == expect_state, run
    for r in run["ranks"]:
        assert r["state"] in RANK_END, r
    if followed:
        _compare_logs(cr, cluster, run, skip=set(lost) | set(gone))  # the live copies, untouched
    cr.run("logs", run["id"])  # catch up what a lost host could not send
    _compare_logs(cr, cluster, run, skip=set(gone))
    return run


def _compare_logs(cr, cluster, run, skip):
    home = Path(cr.env["CLUSTERRUN_HOME"])
    for r in run["ranks"]:
        if r["host"] in skip or r["state"] == "not-started":
            continue
        path = f"/home/cr/.clusterrun/runs/{run['id']}/rank-{r['rank']}.log"
        rc, out, err = cluster.exec(r["host"], ["sha256sum", path])
        assert rc == 0, err
        local = (home / "runs" / run["id"] / f"rank-{r['rank']}.log").read_bytes()
        assert out.split()[0] == hashlib.sha256(local).hexdigest(), f"rank {r['rank']}: local copy differs"
