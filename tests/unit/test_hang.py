"""job.hang_timeout with nobody watching (remote/host/run/hang.py), on real supervisors through the local
transport: a run whose ranks all stop writing is stopped as hung, every rank's stack taken first (into its
exit record, its log and RUN/stacks/hang.json); one that keeps writing is not; with two hosts the
coordinator hears its peer's quiet over the mesh and asks for its stacks before the stop. The verdict and
its words are the controller's (outcome.py, stacks.py)."""

import json
import re
import sys
import time
from pathlib import Path

import pytest

from clusterrun import outcome
from clusterrun.config.inventory import Timeouts
from clusterrun.hosts.client import HostClient
from clusterrun.states import RankState, RunState
from clusterrun.transport.local import LocalTransport
from hostkit import make_host, project, spec
from support import wait_for

JOB = """\
import os, sys, time
rank = int(sys.argv[1])
print("rank", rank, "started", flush=True)

def slow_loader():
    time.sleep(120)

def wait_for_peers():
    while True:
        time.sleep(0.05)

if rank == int(sys.argv[2]):
    slow_loader()
wait_for_peers()
"""
CHATTY = "import sys, time\nfor i in range(int(sys.argv[2])):\n    print('step', i, flush=True)\n    time.sleep(0.3)\n"


@pytest.fixture
def clients(tmp_path):
    """HostClients of local hosts by name; whatever a test started is stopped after it, also when it failed."""
    made = {}

    def make(name):
        made[name] = HostClient(make_host(tmp_path / name), LocalTransport(name), Timeouts(command=20))
        return made[name]

    yield make
    for c in made.values():
        for folder in sorted(Path(c.host.workdir).glob("runs/*")):
            c.stop(folder.name, 0.5)


def wait_done(folders, timeout):
    """When every folder's done.json was there (time.monotonic())."""
    return wait_for(lambda: all((f / "done.json").exists() for f in folders) and time.monotonic(), timeout,
                    every=0.05, what=f"done.json in {[str(f) for f in folders]}")


def exits(folder, ranks):
    return {r: json.loads((folder / f"rank-{r}.exit").read_text()) for r in ranks}


def verdict(records, host="here"):
    ranks = [outcome.RankResult.from_exit(r, 0, host, info, clock_offset=0.0) for r, info in records.items()]
    return outcome.decide("run", ranks)


def test_a_quiet_run_is_stopped_as_hung_with_every_ranks_stack(tmp_path, clients):
    c = clients("w")
    run = "20261201-000000-0101"
    c.push(run, project(tmp_path, {"job.py": JOB.encode()}), hold=False)
    job = tmp_path / "w" / "runs" / run / "job" / "job.py"
    ranks = [(r, [sys.executable, str(job), str(r), "1"]) for r in range(3)]
    t0 = time.monotonic()
    c.start(run, spec(run, ranks, grace=1.0, hang_timeout=2.0))
    folder = tmp_path / "w" / "runs" / run
    took = wait_done([folder], 30) - t0
    assert took < 2 + 1 + 6, took  # hang_timeout + grace + start-up and slack on a busy 2-core machine
    records = exits(folder, range(3))
    assert all(r["stopped"] and r["stop_reason"] == "hung: no output for 2s" for r in records.values()), records
    assert [f["function"] for f in records[1]["stack"]][:2] == ["slow_loader", "<module>"]
    assert records[0]["stack"][0]["function"] == "wait_for_peers"
    assert "slow_loader" in (folder / "rank-1.log").read_text()  # where it was, in its own log
    dump = json.loads((folder / "stacks" / "hang.json").read_text())
    assert sorted(e["rank"] for e in dump["ranks"]) == [0, 1, 2] and dump["reason"] == "hung: no output for 2s"
    # by py-spy where the test extra installed it (the supervisor's child may attach), else faulthandler
    assert re.search(r"took the stacks of ranks 0,1,2 \((faulthandler|py-spy)\)", (folder / "supervisor.log").read_text())
    result = verdict(records)
    assert (result.state, result.exit_code) == (RunState.FAILED, 1)
    assert result.reason == ("hung: no output for 2s; rank 1 on here in slow_loader (job.py:6); "
                             "ranks 0,2 in wait_for_peers")
    assert result.root_cause.rank == 1 and result.root_cause.describe() == "hung in slow_loader (job.py:6)"


def test_a_run_that_keeps_writing_is_not_hung(tmp_path, clients):
    c = clients("w")
    run = "20261201-000000-0102"
    c.push(run, project(tmp_path, {"job.py": CHATTY.encode()}), hold=False)
    job = tmp_path / "w" / "runs" / run / "job" / "job.py"
    # rank 0 is silent (waits), rank 1 writes every 0.3 s for 4 s: no rank was quiet for 2 s in a row...
    ranks = [(0, [sys.executable, "-c", "import time; time.sleep(4)"]), (1, [sys.executable, str(job), "1", "14"])]
    c.start(run, spec(run, ranks, grace=1.0, hang_timeout=2.0))
    folder = tmp_path / "w" / "runs" / run
    wait_done([folder], 30)
    records = exits(folder, range(2))
    assert all(r["exit_code"] == 0 and "stop_reason" not in r and "stack" not in r for r in records.values())
    assert verdict(records).state is RunState.SUCCEEDED


def test_two_hosts_the_coordinator_hears_the_peers_quiet_and_takes_its_stacks_first(tmp_path, clients):
    a, b = clients("a"), clients("b")
    run = "20261201-000000-0103"
    common = {"token": "b" * 32, "host_lost": 6.0, "join_timeout": 20.0, "run": run, "bind": "127.0.0.1"}
    for name, c in (("a", a), ("b", b)):
        c.push(run, project(tmp_path / name, {"job.py": JOB.encode()}), hold=False)

    def ranks(name, r):
        return [(r, [sys.executable, str(tmp_path / name / "runs" / run / "job" / "job.py"), str(r), "1"])]

    t0 = time.monotonic()
    state = a.start(run, spec(run, ranks("a", 0), grace=1.0, hang_timeout=3.0, node_rank=0, node="a",
                              peers={**common, "coordinator": True, "expect": [1], "allow": ["127.0.0.1"]}))
    b.start(run, spec(run, ranks("b", 1), grace=1.0, hang_timeout=3.0, node_rank=1, node="b",
                      peers={**common, "addr": "127.0.0.1", "port": state["coordinator"]["port"]}))
    folders = [tmp_path / n / "runs" / run for n in ("a", "b")]
    took = wait_done(folders, 40) - t0
    assert took < 3 + 1 + 8, took
    r0, r1 = exits(folders[0], [0])[0], exits(folders[1], [1])[1]
    assert r0["stop_reason"] == r1["stop_reason"] == "hung: no output for 3s", (r0, r1)
    assert r1["stack"][0]["function"] == "slow_loader" and r0["stack"][0]["function"] == "wait_for_peers"
    assert (folders[1] / "stacks" / "hang.json").exists()  # the peer took its own, when asked
    ranks_ = [outcome.RankResult.from_exit(0, 0, "a", r0, clock_offset=0.0),
              outcome.RankResult.from_exit(1, 1, "b", r1, clock_offset=0.0)]
    result = outcome.decide("run", ranks_)
    assert result.state is RunState.FAILED and result.root_cause.rank == 0  # two groups of one: lowest first
    assert "rank 0 on a in wait_for_peers (job.py:10); rank 1 in slow_loader" in result.reason, result.reason
    assert all(RankState(r.state) is RankState.STOPPED for r in ranks_)
