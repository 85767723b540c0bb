"""`clusterrun clean`, retention and disk at a glance, over real SSH on the container cluster: run folders
and cache objects go exactly as the rules say, running runs and pushes in flight are never touched."""

import hashlib
import json
import os
import threading

import pytest

from clusterkit import JOBS
from faultkit import FAST
from support import wait_for, write_tree

pytestmark = pytest.mark.integration

WORK = "/home/cr/.clusterrun"


def project(tmp_path, blob: bytes, name="p"):
    root = tmp_path / name
    for old in (root / "data").glob("*"):  # the blob a new file (a new inode), not the old one rewritten
        old.unlink()
    return write_tree(root, {"worker.py": (JOBS / "worker.py").read_bytes(), "data/blob.bin": blob})


def host_sh(cluster, host, script):
    rc, out, err = cluster.exec(host, ["sh", "-c", script])
    assert rc == 0, err
    return out


def inodes(cluster, host, where):
    return set(host_sh(cluster, host, f"find {where} -type f -printf '%i\\n' 2>/dev/null || true").split())


def cache_inodes(cluster, host):
    return inodes(cluster, host, f"{WORK}/cache/objects -mindepth 2")


def run_inodes(cluster, host, run_id):
    return inodes(cluster, host, f"{WORK}/runs/{run_id}/job")


def tree_hash(cluster, host):
    listing = host_sh(cluster, host, f"cd {WORK} && find . -printf '%p %s %i %n %T@\\n' | sort")
    return hashlib.sha256(listing.encode()).hexdigest()


def launch_runs(cr, tmp_path, n, **inv_kw):
    ids = []
    for i in range(n):
        root = project(tmp_path, os.urandom(20_000) + bytes([i]))
        inv = cr.inventory(job={"root": str(root), "args": ["--no-dist", "--steps", "1"], "sync": ["data/"]},
                           top={"timeouts": FAST}, **inv_kw)
        done = cr.run("launch", inv)
        assert done.returncode == 0, done.stderr
        ids.append(cr.ps()[0]["id"])
    return ids, inv


def test_keep_2_leaves_two_runs_and_the_cache_holds_exactly_what_they_use(cr, cluster, tmp_path):
    ids, inv = launch_runs(cr, tmp_path, 5)
    mine = set(ids)
    dry = cr.run("clean", inv, "--keep", "2", "--cache", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    would = json.loads(dry.stdout)
    assert {r["id"] for r in would["hosts"][0]["removed"]} == set(ids[:3])
    done = cr.run("clean", inv, "--keep", "2", "--cache")
    assert done.returncode == 0, done.stderr
    assert "removed (keep the newest 2)" in done.stderr
    for host in ("node0", "node1", "node2", "node3"):
        left = set(cr.run_dirs(host)) & mine
        assert left == set(ids[3:]), host
        # every object a run folder still there links (other tests' runs share these hosts), and nothing else
        linked = inodes(cluster, host, f"{WORK}/runs/*/job -links +1")
        assert run_inodes(cluster, host, ids[4]) <= cache_inodes(cluster, host) == linked, host
    for run_id in ids[:3]:  # their logs were kept here
        assert (cr.tmp / "cr-home" / "runs" / run_id / "rank-0.log").stat().st_size > 0
    ps = json.loads(cr.run("ps", "--disk", "--json").stdout)
    disk = {r["id"]: r["disk"] for r in ps}
    assert disk[ids[0]]["removed_from"] == ["node0", "node1", "node2", "node3"] and disk[ids[0]]["bytes"] == 0
    assert disk[ids[4]]["bytes"] > 0 and set(disk[ids[4]]["hosts"]) == {"node0", "node1", "node2", "node3"}


def test_dry_run_changes_nothing(cr, cluster, tmp_path):
    _, inv = launch_runs(cr, tmp_path, 2)
    before = {h: tree_hash(cluster, h) for h in ("node0", "node3")}
    done = cr.run("clean", inv, "--keep", "0", "--cache", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "dry run: nothing was removed" in done.stderr
    assert {h: tree_hash(cluster, h) for h in before} == before


def test_a_running_run_is_never_touched(cr, cluster, tmp_path):
    root = project(tmp_path, b"x")
    inv = cr.inventory(job={"root": str(root), "args": ["--no-dist", "--steps", "600", "--step-time", "0.1"],
                            "sync": ["data/"]}, top={"timeouts": FAST})
    assert cr.run("launch", "--detach", inv).returncode == 0
    run_id = cr.ps()[0]["id"]
    try:
        everything = cr.run("clean", inv, "--cache")
        assert everything.returncode == 0, everything.stderr
        named = cr.run("clean", run_id)
        assert named.returncode == 1, named.stderr
        assert f"node2: {run_id}: refused: running: its supervisor runs" in named.stderr
        for host in ("node0", "node1", "node2", "node3"):
            assert run_id in cr.run_dirs(host)
            assert host_sh(cluster, host, f"test -f {WORK}/runs/{run_id}/job/worker.py && echo ok").strip() == "ok"
    finally:
        assert cr.run("stop", run_id).returncode == 0
    gone = cr.run("clean", run_id)
    assert gone.returncode == 0, gone.stderr
    assert all(run_id not in cr.run_dirs(h) for h in ("node0", "node1", "node2", "node3"))


def test_a_push_racing_clean_cache_never_fails_or_loses_an_object(cr, cluster, tmp_path):
    """Two versions of a file alternate, so each push counts on an object of a run that `clean` is removing,
    while a fresh 4 MB file keeps the push busy receiving (the window in which a sweep would bite)."""
    versions = [os.urandom(300_000), os.urandom(300_000)]
    digests = [hashlib.sha256(v).hexdigest() for v in versions]
    stop = threading.Event()
    cleans = []

    def cleaner():
        while not stop.is_set():
            cleans.append(cr.run("clean", str(tmp_path / "inv.yaml"), "--keep", "0", "--cache").returncode)

    launches = []
    root = project(tmp_path, versions[0])
    inv = cr.inventory(job={"root": str(root), "args": ["--no-dist", "--steps", "1"], "sync": ["data/"]},
                       top={"timeouts": FAST}, hosts=2)
    t = threading.Thread(target=cleaner, daemon=True)
    t.start()
    try:
        for i in range(20):
            (root / "data" / "blob.bin").write_bytes(versions[i % 2])
            (root / "data" / "fresh.bin").write_bytes(os.urandom(4 << 20))
            done = cr.run("launch", inv)
            assert done.returncode == 0, f"round {i}: {done.stderr[-2000:]}"
            run_id = cr.ps()[0]["id"]
            launches.append(run_id)
            for host in ("node0", "node1"):  # the run's files were whole when it ran: its worker exited 0
                out = host_sh(cluster, host, f"sha256sum {WORK}/runs/{run_id}/job/data/blob.bin 2>/dev/null || true")
                assert not out or out.split()[0] == digests[i % 2]
    finally:
        stop.set()
        t.join(120)
    assert len(cleans) >= 3 and set(cleans) <= {0}, cleans
    final = cr.run("clean", inv, "--keep", "0", "--cache")
    assert final.returncode == 0, final.stderr
    for host in ("node0", "node1"):  # nothing of ours left, and no object without a run folder
        assert not set(cr.run_dirs(host)) & set(launches)
        assert host_sh(cluster, host, f"find {WORK}/cache/objects -mindepth 2 -type f -links 1 | wc -l").strip() == "0"


def test_retention_is_applied_after_a_launch(cr, cluster, tmp_path):
    cr.env.pop("CLUSTERRUN_NO_RETENTION")
    ids, inv = launch_runs(cr, tmp_path, 3, hosts=2)
    assert cr.run("launch", inv).returncode == 0  # retention: keep_runs 2, applied after this one started
    ids.append(cr.ps()[0]["id"])
    # every: 0, as the launches above already took this inventory's turn for the next hour
    inv.write_text(inv.read_text() + "retention: {keep_runs: 2, max_age: 30d, cache_max: 1G, every: 0}\n")
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    ids.append(cr.ps()[0]["id"])
    wait_for(lambda: all(set(cr.run_dirs(h)) & set(ids) == set(ids[-2:]) for h in ("node0", "node1")),
             timeout=60, what="retention to leave the newest two runs")
    log = (cr.tmp / "cr-home" / "retention.log").read_text()
    assert "removed (keep the newest 2 or older than 30d)" in log


def test_a_full_disk_is_freed_by_clean_and_the_launch_then_succeeds(cr, cluster, tmp_path, small_disk):  # noqa: F811
    """node2's workdir is a 4 MB tmpfs: runs of 1 MB of fresh data each fill it until a push is refused."""
    filled = []
    for i in range(6):
        root = project(tmp_path, os.urandom(900_000), name=f"p{i}")
        inv = cr.inventory(f"inv{i}.yaml", job={"root": str(root), "args": ["--no-dist", "--steps", "1"],
                                                "sync": ["data/"]}, top={"timeouts": FAST}, edit_hosts=small_disk)
        done = cr.run("launch", inv)
        if done.returncode != 0:
            break
        filled.append(cr.ps()[0]["id"])
    assert done.returncode == 1 and "node2: push failed: not enough disk space" in done.stderr, done.stderr
    assert len(filled) >= 2
    check = cr.run("check", inv, "--json")
    disk = {h["host"]: h["checks"]["disk"] for h in json.loads(check.stdout)["hosts"]}
    assert disk["node2"]["status"] in ("warn", "fail") and "runs: " in disk["node2"]["detail"], disk["node2"]
    cleaned = cr.run("clean", inv, "--keep", "0", "--cache")
    assert cleaned.returncode == 0, cleaned.stderr
    again = cr.run("launch", inv)
    assert again.returncode == 0, again.stderr


def test_a_folder_the_job_made_unreadable_is_removed_too(cr, cluster, tmp_path):
    """Issue 21: as an ordinary user a folder of mode 000 made rmtree call its error handler with os.open,
    a TypeError that crashed `clean` (no JSON, the other runs kept, a .removing-* folder left for ever)."""
    root = write_tree(tmp_path / "locker", {"lock.py": "import os\nos.makedirs('out/deep')\nopen('out/deep/f', 'w')"
                                                       ".write('x')\nos.chmod('out/deep', 0)\nos.chmod('out', 0)\n"})
    inv = cr.inventory(hosts=1, job={"root": str(root), "script": "lock.py", "rank_flags": False},
                       top={"timeouts": FAST})
    for _ in range(2):
        done = cr.run("launch", inv)
        assert done.returncode == 0, done.stderr
    runs = [r["id"] for r in cr.ps()]
    done = cr.run("clean", *runs, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (host,) = json.loads(done.stdout)["hosts"]
    assert sorted(r["id"] for r in host["removed"]) == sorted(runs) and host["refused"] == []
    left = host_sh(cluster, "node0", f"ls -A {WORK}/runs").split()
    assert not set(runs) & set(left) and not [n for n in left if n.startswith(".removing-")], left
