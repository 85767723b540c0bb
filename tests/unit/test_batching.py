"""No per-host step serial on the controller (issue 37, item 2): the registry's writes for many hosts are one
transaction (Db.batch), a stop of N hosts reads the record once and commits a constant number of times."""

import threading
import time

import pytest

from support import inventory_text, write_tree

from clusterrun.config.inventory import inventory_snapshot, load_inventory
from clusterrun.plan import build_plan, plan_to_dict, rank_rows
from clusterrun.registry.store import RunStore
from clusterrun.runs import reconcile as reconcile_mod
from clusterrun.runs.stop import stop_run
from clusterrun.states import RankState


def make_run(tmp_path, hosts: int, run_id: str = "20260101-000000-abcd"):
    write_tree(tmp_path, {"job.py": "print('hi')\n", "inv.yaml": inventory_text(
        [{"name": f"n{i}", "workdir": f"{tmp_path}/work-{i}"} for i in range(hosts)], {"script": "job.py"},
        defaults={"connection": "local"}, master={"port": 29500})})
    inv = load_inventory(str(tmp_path / "inv.yaml"))
    plan = build_plan(inv, run_id)
    store = RunStore(str(tmp_path / "home"))
    store.create(run_id, inv.path, inventory_snapshot(inv), plan_to_dict(plan), {"host": "elsewhere", "pid": 1},
                 [{"node_rank": n.index, "name": n.host.name} for n in plan.nodes], rank_rows(plan))
    with store.batch():
        for r in plan.ranks:
            store.update_rank(run_id, r.rank, state=RankState.RUNNING)
    return store, plan


class StoppingHost:
    def __init__(self, ranks):
        self.ranks = ranks

    def stop(self, run_id, grace):
        now = time.time()
        return {"now": now, "exits": {str(r): {"exit_code": None, "signal": 15, "started_at": now - 5,
                                               "ended_at": now} for r in self.ranks}}

    def close(self):
        pass


def test_a_batch_is_one_commit_and_nested_batches_join_it(tmp_path):
    store, plan = make_run(tmp_path, 3)
    db = store._db
    before = db.commits
    with store.batch():
        for r in plan.ranks:
            store.update_rank(plan.run_id, r.rank, note="x")
        with store.batch():
            store.update_host(plan.run_id, 0, error="e")
        with db.transaction() as conn:
            conn.execute("UPDATE runs SET reason = 'r' WHERE id = ?", (plan.run_id,))
    assert db.commits == before + 1
    record = store.get(plan.run_id)
    assert [r.note for r in record.ranks] == ["x"] * 3 and record.reason == "r"


def test_what_a_batch_wrote_is_kept_when_its_block_raises(tmp_path):
    store, plan = make_run(tmp_path, 2)
    with pytest.raises(KeyError):
        with store.batch():
            store.update_rank(plan.run_id, 0, note="kept")
            raise KeyError("bug")
    assert store.get(plan.run_id).ranks[0].note == "kept"
    store.update_rank(plan.run_id, 1, note="after")  # the connection is usable again
    assert store.get(plan.run_id).ranks[1].note == "after"


def test_another_threads_write_waits_for_the_batch_and_is_not_part_of_it(tmp_path):
    store, plan = make_run(tmp_path, 2)
    inside, wrote = threading.Event(), threading.Event()

    def other():
        inside.wait(5)
        store.update_rank(plan.run_id, 1, note="other")
        wrote.set()

    t = threading.Thread(target=other)
    t.start()
    with store.batch():
        store.update_rank(plan.run_id, 0, note="mine")
        inside.set()
        assert not wrote.wait(0.2)  # blocked until the batch ends
    t.join(5)
    assert wrote.is_set() and [r.note for r in store.get(plan.run_id).ranks] == ["mine", "other"]


@pytest.mark.parametrize("hosts", [4, 64])
def test_stop_of_many_hosts_reads_the_record_once_and_commits_a_few_times(tmp_path, monkeypatch, hosts):
    store, plan = make_run(tmp_path, hosts)
    ranks_of = {n.host.name: [r.rank for r in n.ranks] for n in plan.nodes}
    reads = []
    real_get = RunStore.get
    monkeypatch.setattr(RunStore, "get", lambda self, run_id: reads.append(run_id) or real_get(self, run_id))
    before = store._db.commits
    record, failed = stop_run(store, plan.run_id, lambda host: StoppingHost(ranks_of[host.name]), grace=1.0)
    assert not failed and record.terminal
    assert all(r.state.terminal for r in record.ranks) and len(record.ranks) == hosts
    assert store._db.commits - before <= 3  # the answers, the verdict (not a commit per rank and per host)
    assert len(reads) <= 4  # not one read of the whole record per host


def test_reconcile_of_many_hosts_is_one_transaction(tmp_path, monkeypatch):
    store, plan = make_run(tmp_path, 32)

    class Status:
        def __init__(self, ranks):
            self.ranks = ranks

        def status(self, key):
            now = time.time()
            return {"started": True, "done": True, "now": now, "ranks": {
                str(r): {"pid": 10, "exit": {"exit_code": 0, "started_at": now - 1, "ended_at": now}}
                for r in self.ranks}}

        def close(self):
            pass

    ranks_of = {n.host.name: [r.rank for r in n.ranks] for n in plan.nodes}
    before = store._db.commits
    record, failed = reconcile_mod.reconcile(store, plan.run_id, lambda host: Status(ranks_of[host.name]))
    assert not failed and record.terminal and all(r.exit_code == 0 for r in record.ranks)
    assert store._db.commits - before == 1


def test_rows_the_hosts_threads_leave_are_written_in_one_commit(tmp_path):
    store, plan = make_run(tmp_path, 64)
    before = store._db.commits
    threads = [threading.Thread(target=store.update_host_later, args=(plan.run_id, n.index),
                                kwargs={"state": "pushed", "pushed_bytes": n.index}) for n in plan.nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert store._db.commits == before  # nothing written yet
    store.flush()
    assert store._db.commits == before + 1
    hosts = store.get(plan.run_id).hosts
    assert [h.state.value for h in hosts] == ["pushed"] * 64 and [h.pushed_bytes for h in hosts] == list(range(64))
    store.update_host_later(plan.run_id, 0, state="started")
    assert store.get(plan.run_id).hosts[0].state.value == "started"  # a read sees what is kept


def test_clean_copies_logs_on_the_connections_it_listed_with(tmp_path, monkeypatch):
    """clean of a detached run (no local log copies yet): one connection a host, not one to list and
    remove and another to copy the logs first."""
    import subprocess
    import sys

    from clusterrun.clean.policy import Rules
    from clusterrun.clean.apply import clean_hosts
    from clusterrun.hosts.client import make_connect

    hosts = [{"name": f"h{i}", "workdir": f"{tmp_path}/work-{i}"} for i in range(3)]
    write_tree(tmp_path, {"job.py": "print('hello from', __import__('os').environ['RANK'], flush=True)\n",
                          "inv.yaml": inventory_text(hosts, {"script": "job.py"}, defaults={"connection": "local"},
                                                     master={"port": "auto"})})
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    done = subprocess.run([sys.executable, "-m", "clusterrun", "launch", "--detach", str(tmp_path / "inv.yaml")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[-1]
    store = RunStore(str(tmp_path / "home"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the job ends by itself; ps brings the record up to date
        subprocess.run([sys.executable, "-m", "clusterrun", "ps"], capture_output=True, cwd=tmp_path, timeout=60)
        if store.get(run_id).terminal:
            break
        time.sleep(0.3)
    inv = load_inventory(str(tmp_path / "inv.yaml"))
    real, made = make_connect(inv.timeouts), []

    def connect(host):
        made.append(host.name)
        return real(host)

    results = clean_hosts(inv.hosts, store, connect, Rules(runs=(run_id,)))
    assert all(not r.error and [x["id"] for x in r.removed] == [run_id] for r in results), results
    assert sorted(made) == ["h0", "h1", "h2"]  # once each
    copies = [store.log_file(run_id, r) for r in range(3)]
    assert all("hello from" in open(p).read() for p in copies)  # the logs came first
