"""Disk full during the push, two runs side by side, and a rank that floods its output."""

import os
import re
import time
from pathlib import Path

import pytest

from clusterkit import JOBS
from faultkit import FAST, WORK, all_stepping, check_invariants
from support import wait_for, write_tree

pytestmark = pytest.mark.integration


def project(tmp_path, files):
    return write_tree(tmp_path / "project", {"worker.py": (JOBS / "worker.py").read_bytes(),
                                             **{f"data/{name}": data for name, data in files.items()}})


def small_disk_listing(cluster, host="node2"):
    """Files on node2's small disk, but for the host program itself (installed once, kept), the cache's
    empty lock file (pushes and `clean --cache` share it; it holds no bytes) and the host python's stack
    fingerprint (cached with the push's first answer, keyed by the interpreter: the host's, not the push's)."""
    rc, out, _ = cluster.exec(host, ["find", "/small", "-mindepth", "1", "-not", "-type", "d",
                                     "-not", "-path", "/small/clusterrun/bin/*",
                                     "-not", "-path", "/small/clusterrun/fingerprints/*",
                                     "-not", "(", "-path", "/small/clusterrun/cache/lock", "-empty", ")"])
    assert rc == 0
    return out.split()


def test_a_push_bigger_than_the_free_space_is_refused_before_sending(cr, cluster, tmp_path, small_disk):
    root = project(tmp_path, {"big.bin": os.urandom(6 << 20)})
    inv = cr.inventory(job={"root": str(root), "args": ["--steps", "1"], "sync": ["data/"]}, top={"timeouts": FAST},
                       edit_hosts=small_disk)
    before = {h: cr.run_dirs(h) for h in ("node0", "node1", "node3")}
    done = cr.run("launch", inv)
    assert done.returncode == 1, done.stderr
    assert "node2: push failed: not enough disk space" in done.stderr
    assert "/small/clusterrun/cache/objects" in done.stderr
    assert small_disk_listing(cluster) == []
    assert {h: cr.run_dirs(h) for h in before} == before  # what the other hosts received is removed again
    run = cr.ps()[0]
    assert run["state"] == "failed" and {r["state"] for r in run["ranks"]} == {"not-started"}


def test_disk_full_in_the_middle_of_a_push_removes_partial_files(cr, cluster, tmp_path, small_disk):
    """Bytes fit, inodes do not: the host runs out of space (ENOSPC) half way through writing objects."""
    root = project(tmp_path, {f"f{i:03}.txt": os.urandom(64) + str(i).encode() for i in range(300)})
    inv = cr.inventory(job={"root": str(root), "args": ["--steps", "1"], "sync": ["data/"]}, top={"timeouts": FAST},
                       edit_hosts=small_disk)
    done = cr.run("launch", inv)
    assert done.returncode == 1, done.stderr
    assert re.search(r"node2: push failed: No space left on device \(/small/clusterrun/\S+\)", done.stderr), done.stderr
    assert "nothing was started" in done.stderr
    assert small_disk_listing(cluster) == []  # no partial object, no run folder
    run = cr.ps()[0]
    assert {r["state"] for r in run["ranks"]} == {"not-started"}
    assert cluster.orphans() == []


def test_stopping_one_run_never_touches_another_on_the_same_hosts(cr, cluster):
    inv = cr.inventory(job={"args": WORK}, top={"timeouts": FAST, "master": {"port": "auto"}})
    a = cr.run("launch", "--detach", inv)
    b = cr.run("launch", "--detach", inv)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    run_a, run_b = a.stdout.strip(), b.stdout.strip()
    wait_for(lambda: all_stepping(cr, run_a) and all_stepping(cr, run_b), timeout=120)
    stop = cr.run("stop", run_a)
    assert stop.returncode == 0, stop.stderr
    runs = {r["id"]: r for r in cr.ps()}
    assert runs[run_a]["state"] == "stopped" and runs[run_b]["state"] == "running"
    steps_before = cr.run("logs", run_b, "--rank", "3").stdout.count("step")
    time.sleep(2)
    assert cr.run("logs", run_b, "--rank", "3").stdout.count("step") > steps_before  # B still trains
    assert cr.run("stop", run_b).returncode == 0


FLOOD = r"""
import os, sys, time
rank = int(os.environ["RANK"])
out = sys.stdout.buffer
t = time.monotonic()
written = 0
if rank == 0:
    line = b"x" * 200 + b"\n"
    block = line * 5000                                   # ~1 MB of short lines
    for i in range(150):
        out.write(block); written += len(block)
    out.write(b"L" * (3 << 20) + b"\n"); written += (3 << 20) + 1  # one 3 MB line
    junk = bytes(range(256)) * 4096 + b"\xff\xfe\xc3\x28 invalid utf-8 \xed\xa0\x80\n"
    out.write(junk); written += len(junk)
    out.write(b"no newline at the end"); written += 21
    out.flush()
    print(f"\nrank 0 wrote {written} bytes in {time.monotonic() - t:.2f} s", file=sys.stderr, flush=True)
else:
    for i in range(20):
        print(f"rank {rank} line {i}", flush=True)
        time.sleep(0.05)
"""


def test_a_flooding_rank_is_never_blocked_and_nothing_is_lost(cr, cluster, tmp_path):
    root = write_tree(tmp_path / "flood", {"flood.py": FLOOD})
    inv = cr.inventory(job={"root": str(root), "script": "flood.py", "args": []}, top={"timeouts": FAST})
    import subprocess

    proc = subprocess.Popen(cr.argv("launch", inv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cr.env)
    shown = []
    peak = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as fh:
                peak = max(peak, int(re.search(r"VmHWM:\s+(\d+) kB", fh.read()).group(1)))
        except (OSError, AttributeError):
            pass
        out = proc.stdout.read1(1 << 20)  # keep reading what it prints
        if not out:
            break
        shown.append(out)
    rest, err = proc.communicate(timeout=300)
    shown = b"".join(shown) + rest
    assert proc.returncode == 0, err[-2000:]
    print(f"\ncontroller peak RSS {peak / 1024:.0f} MB")
    assert peak < 250 * 1024, f"controller peak RSS {peak} kB"
    run = check_invariants(cr, cluster, expect_state="succeeded")
    log = Path(cr.env["CLUSTERRUN_HOME"]) / "runs" / run["id"] / "rank-0.log"
    data = log.read_bytes()
    assert b"no newline at the end\nrank 0 wrote" in data and b"\xff\xfe\xc3\x28 invalid utf-8" in data
    wrote = re.search(rb"rank 0 wrote (\d+) bytes in ([\d.]+) s", data)
    assert int(wrote.group(1)) + len(wrote.group(0)) + 2 <= len(data)
    assert float(wrote.group(2)) < 10  # writing to its log file: never held up by the controller
    # all of it was shown too, in order: rank 0's lines, prefix taken off, are its log with a newline added
    # where an unfinished line was shown in pieces (64 KiB, or idle for a second)
    prefix = b"[node0 r0] "
    mine = b"".join(line[len(prefix):] for line in shown.split(b"\n") if line.startswith(prefix))
    assert mine == data.replace(b"\n", b"")
