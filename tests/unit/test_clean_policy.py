"""clean: the policy (pure), and the host side driven through the local transport (real files, real
supervisors): what may go, what the cache keeps, what a dry run touches (nothing)."""

import hashlib
import os
import sys

from clusterrun.clean.policy import Rules, select_removals
from clusterrun.registry.store import RunStore
from hostkit import project, spec
from support import poll, wait_for

NOW = 1_800_000_000.0


def entry(run_id, status="finished", ended=NOW - 60, size=10):
    return {"id": run_id, "status": status, "why": "", "bytes": size, "ended_at": ended, "logs": {}}


def removed(decisions):
    return [d.run_id for d in decisions if d.remove]


def test_keep_older_than_and_both():
    listing = [entry(f"2026120{i}-000000-aaaa", ended=NOW - (6 - i) * 86400) for i in range(1, 6)]  # oldest first
    ours = {e["id"]: None for e in listing}
    ids = [e["id"] for e in listing]
    assert removed(select_removals(listing, Rules(keep=2), ours, NOW)) == ids[:3]
    assert removed(select_removals(listing, Rules(older_than_s=3.5 * 86400), ours, NOW)) == ids[:2]  # ended 5 and 4 days ago
    # both: a run goes when either rule says so (keep_runs and max_age of retention)
    assert removed(select_removals(listing, Rules(keep=4, older_than_s=3.5 * 86400), ours, NOW)) == ids[:2]
    assert removed(select_removals(listing, Rules(keep=2, older_than_s=4.5 * 86400), ours, NOW)) == ids[:3]
    assert removed(select_removals(listing, Rules(), ours, NOW)) == [e["id"] for e in listing]  # every finished run
    assert removed(select_removals(listing, Rules(runs=(listing[2]["id"],)), ours, NOW)) == [listing[2]["id"]]


def test_never_what_runs_may_run_or_is_someone_elses():
    listing = [entry("20261201-000000-0001", status="running"), entry("20261201-000000-0002", status="receiving"),
               entry("20261201-000000-0003"), entry("20261201-000000-0004", status="unstarted"),
               entry("20261201-000000-0005")]
    ours = {e["id"]: None for e in listing if e["id"] != "20261201-000000-0005"}
    decisions = {d.run_id: d for d in select_removals(listing, Rules(keep=0), ours, NOW)}
    assert removed(decisions.values()) == ["20261201-000000-0003", "20261201-000000-0004"]
    assert decisions["20261201-000000-0001"].why.startswith("running")
    assert decisions["20261201-000000-0005"].why.startswith("not this registry's run")
    with_foreign = select_removals(listing, Rules(keep=0, foreign=True), ours, NOW)
    assert "20261201-000000-0005" in removed(with_foreign)


def test_the_registry_protects_runs_that_may_still_run(tmp_path):
    store = RunStore(str(tmp_path / "state"))
    store.create("20261201-000000-0001", "inv.yaml", {}, {"nodes": []}, {"host": "elsewhere", "pid": 1}, [], [])
    record = store.get("20261201-000000-0001")  # state "starting": not ended
    decisions = select_removals([entry(record.id)], Rules(keep=0), {record.id: record}, NOW)
    assert not decisions[0].remove and "may still run" in decisions[0].why


def tree(root):
    """Every path under the workdir with its size, inode and links; not the host program itself (bin/: Python
    caches the bytecode of each of its modules the first time a command uses it)."""
    out = []
    for folder, dirs, files in os.walk(root):
        if folder == str(root):
            dirs[:] = [d for d in dirs if d != "bin"]
        for name in sorted(dirs + files):
            st = os.lstat(os.path.join(folder, name))
            out.append((os.path.relpath(os.path.join(folder, name), root), st.st_size, st.st_ino, st.st_nlink))
    return sorted(out)


def test_host_removes_finished_runs_and_collects_exactly_the_unlinked_objects(host_client, tmp_path):
    work = tmp_path / "work"
    shared = b"shared" * 100
    for i, run_id in enumerate(["20261201-000000-0001", "20261201-000000-0002", "20261201-000000-0003"]):
        m = project(tmp_path, {"job.py": b"import sys; sys.exit(0)\n", "data/shared.bin": shared,
                               "data/own.bin": b"own %d" % i * 1000})
        host_client.push(run_id, m, hold=False)
        host_client.start(run_id, spec(run_id, [(0, [sys.executable, "job.py"])]))
    running = "20261201-000000-0004"
    host_client.push(running, project(tmp_path, {"job.py": b"import time; time.sleep(30)\n"}), hold=False)
    host_client.start(running, spec(running, [(0, [sys.executable, "job.py"])]))
    poll(lambda: sum(r["status"] == "finished" for r in host_client.runs()["runs"]) >= 3, timeout=20, every=0.1)
    listing = {r["id"]: r for r in host_client.runs()["runs"]}
    assert listing[running]["status"] == "running"
    assert {r["status"] for k, r in listing.items() if k != running} == {"finished"}
    assert listing["20261201-000000-0001"]["logs"] == {"0": {"0": 0}}

    before = tree(work)
    dry = host_client.clean({"remove": ["20261201-000000-0001", "20261201-000000-0002", running], "cache": True,
                       "dry_run": True})
    assert tree(work) == before  # a dry run touches nothing
    assert [r["id"] for r in dry["removed"]] == ["20261201-000000-0001", "20261201-000000-0002"]
    assert dry["refused"] == [{"id": running, "why": "its supervisor runs"}]
    assert dry["cache"]["removed"] == 2  # the two runs' own.bin (shared.bin and job.py stay linked)

    done = host_client.clean({"remove": ["20261201-000000-0001", "20261201-000000-0002", running], "cache": True})
    assert sorted(os.listdir(work / "runs")) == ["20261201-000000-0003", running]
    assert done["cache"]["removed"] == dry["cache"]["removed"]
    objects = {os.stat(os.path.join(d, f)).st_ino for d, _, fs in os.walk(work / "cache" / "objects")
               for f in fs if len(os.path.basename(d)) == 2}
    linked = {os.stat(os.path.join(d, f)).st_ino for d, _, fs in os.walk(work / "runs") for f in fs
              if os.stat(os.path.join(d, f)).st_nlink > 1}
    assert objects == linked
    log = (work / "cache" / "objects" / "objects.log").read_text().split("\n")
    shas = {line.split()[0] for line in log if line}
    own = hashlib.sha256(b"own 0" * 1000).hexdigest()
    assert own not in shas and hashlib.sha256(shared).hexdigest() in shas  # the index was compacted
    host_client.stop(running, 0.5)


def test_clean_finishes_what_an_earlier_clean_left_and_modes_a_job_took_away(host_client, tmp_path):
    """Issue 21: a .removing-* folder an earlier clean left (killed halfway) is collected; folders a job made
    mode 000 go too (as root here; tests/integration/test_clean.py has the same as an ordinary user)."""
    work = tmp_path / "work"
    ids = ["20261201-000000-0011", "20261201-000000-0012"]
    for run_id in ids:
        host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
        host_client.start(run_id, spec(run_id, [(0, [sys.executable, "-c", "import os; os.makedirs('out/deep'); "
                                                                          "open('out/deep/f', 'w').write('x'); "
                                                                          "os.chmod('out', 0)"])]))
    poll(lambda: sum(r["status"] == "finished" for r in host_client.runs()["runs"]) >= 2, timeout=20, every=0.1)
    leftover = work / "runs" / ".removing-20261201-000000-0001-99999"  # what a clean killed halfway left
    (leftover / "sub").mkdir(parents=True)
    (leftover / "sub").chmod(0)
    answer = host_client.clean({"remove": ids})
    assert sorted(r["id"] for r in answer["removed"]) == ids and answer["refused"] == []
    assert sorted(os.listdir(work / "runs")) == []


def test_the_sweep_collects_objects_a_killed_push_left_half_written(host_client, tmp_path):
    host_client.push("20261201-000000-0031", project(tmp_path, {"job.py": b"x"}), hold=False)
    cache = tmp_path / "work" / "cache" / "objects"
    partial = cache / "ab" / ("ab" * 32 + ".tmp-424242")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"half")
    host_client.clean({"remove": [], "cache": True})
    assert not partial.exists()


def test_a_run_whose_outputs_were_never_pulled_stays_unless_forced(tmp_path):
    from clusterrun.clean.apply import clean_local
    from clusterrun.outcome import interrupted

    store = RunStore(str(tmp_path / "state"))
    ids = ("20261201-000000-0001", "20261201-000000-0002", "20261201-000000-0003")
    for run_id, outputs in zip(ids, (["outputs/"], ["outputs/"], [])):
        store.create(run_id, "inv.yaml", {"job": {"outputs": outputs}}, {"nodes": []}, {}, [], [])
        store.conclude(interrupted(run_id))
    store.pulls.note(ids[1], "node0", 2, 1000, "/tmp/x")  # its outputs came back
    records = {run_id: store.get(run_id) for run_id in ids}
    assert records[ids[1]].pulled == ("node0",) and records[ids[0]].outputs_unpulled
    listing = [entry(run_id) for run_id in ids]
    decisions = {d.run_id: d for d in select_removals(listing, Rules(keep=0), records, NOW)}
    assert removed(decisions.values()) == [ids[1], ids[2]]  # pulled, and a run that names no outputs
    assert decisions[ids[0]].why == f"outputs never pulled: `clusterrun pull {ids[0]}` first, or --force"
    named = {d.run_id: d for d in select_removals(listing, Rules(runs=(ids[0],)), records, NOW)}
    assert not named[ids[0]].remove  # naming it is not enough
    assert removed(select_removals(listing, Rules(keep=0, force=True), records, NOW)) == list(ids)
    # the registry's own pruning keeps it too (a tombstone would lose the protection)
    assert [(i, r) for i, r, _ in clean_local(store, Rules(keep=0))] == [(ids[0], False), (ids[1], True),
                                                                         (ids[2], True)]
    assert [(i, r) for i, r, _ in clean_local(store, Rules(keep=0, force=True))] == [(ids[0], True)]


def test_a_run_whose_outputs_selected_nothing_has_nothing_to_keep(tmp_path, host_client):
    """clean kept it ("outputs never pulled: pull first") while pull said "nothing to pull" (exit 2), a
    circle, and retention kept such runs for ever (issue 36): the host's listing says the outputs select
    nothing, clean lets the run go and notes it as pulled with nothing; pull says there is nothing to keep."""
    from clusterrun.clean.apply import clean_local
    from clusterrun.outcome import interrupted as interrupted_

    store = RunStore(str(tmp_path / "state"))
    run_id = "20261201-000000-0007"
    host_client.push(run_id, project(tmp_path, {"job.py": b"print('no outputs written')\n"}), hold=False)
    host_client.start(run_id, spec(run_id, [(0, [sys.executable, "job.py"])], outputs=["outputs/", "*.pt"]))
    listing = wait_for(lambda: [e for e in host_client.runs()["runs"] if e["status"] == "finished"])
    assert listing[0]["outputs_found"] is False
    store.create(run_id, "inv.yaml", {"job": {"outputs": ["outputs/", "*.pt"]}}, {"nodes": []}, {}, [], [])
    store.conclude(interrupted_(run_id))
    records = {run_id: store.get(run_id)}
    assert records[run_id].outputs_unpulled
    (decision,) = select_removals(listing, Rules(keep=0), records, NOW)
    assert decision.remove, decision
    # a run whose outputs are there is kept as before
    kept = dict(listing[0], outputs_found=True)
    assert not select_removals([kept], Rules(keep=0), records, NOW)[0].remove
    # the registry's record goes too once the host's folder went with nothing to keep
    from clusterrun.clean.apply import HostClean, _note_removed

    _note_removed(store, records, HostClean("node0", decisions=(decision,), removed=[{"id": run_id, "bytes": 1}]))
    assert not store.get(run_id).outputs_unpulled
    assert [(i, r) for i, r, _ in clean_local(store, Rules(keep=0))] == [(run_id, True)]


def test_pruning_a_record_keeps_what_was_pulled(tmp_path):
    from clusterrun.outcome import interrupted

    store = RunStore(str(tmp_path / "state"))
    store.create("20261201-000000-0001", "inv.yaml", {}, {"nodes": []}, {}, [], [])
    store.conclude(interrupted("20261201-000000-0001"))
    with open(store.log_path("20261201-000000-0001", 0), "w") as fh:
        fh.write("log\n")
    pulled = os.path.join(store.outputs_dir("20261201-000000-0001"), "model.pt")
    with open(pulled, "w") as fh:
        fh.write("weights")
    store.prune("20261201-000000-0001")
    assert os.listdir(os.path.join(store.home, "runs", "20261201-000000-0001")) == ["outputs"]
    assert open(pulled).read() == "weights"


def test_retention_runs_at_most_once_per_interval_per_inventory(tmp_path, monkeypatch, cr_home):
    """Issue 26: a retention pass after every launch meant a second SSH connection and a Python on every
    host per launch; back-to-back launches now pay for one pass per `retention.every` (default 1 h)."""
    from clusterrun.clean import retention
    from clusterrun.config.inventory import parse_inventory

    monkeypatch.delenv("CLUSTERRUN_NO_RETENTION", raising=False)
    spawned = []
    monkeypatch.setattr(retention, "spawn", spawned.append)
    text = "version: 1\nhosts: [{name: a, connection: local}]\njob: {script: t.py}\n"
    inv = parse_inventory(text, str(tmp_path / "a.yaml"))
    other = parse_inventory(text, str(tmp_path / "b.yaml"))
    eager = parse_inventory(text + "retention: {every: 0}\n", str(tmp_path / "c.yaml"))
    for _ in range(3):
        for i in (inv, other, eager):
            retention.AfterLaunch(i).start()
    assert spawned == [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")] + [str(tmp_path / "c.yaml")] * 3
