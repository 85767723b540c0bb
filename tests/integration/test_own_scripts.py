"""Other people's scripts as they are, on the container cluster: torchrun-style (rank from the
environment, strict argparse), imagenet-style (rank in its own flags, through placeholders), torchrun per
host (restarts, teardown, stop, time limit), job.setup, and `clusterrun exec`."""

from __future__ import annotations

import json
import re
import signal
import time
import uuid

import pytest

from faultkit import FAST
from support import wait_for, write_tree

pytestmark = pytest.mark.integration

SCRIPT = {"script": "multinode.py", "args": ["2", "1", "--batch_size", "8"]}


def two_by_two(cr, name="inv.yaml", job=None, env=None, top=None):
    """2 hosts x 2 slots: the shape of the issue's proof."""
    defaults = {"slots": 2}
    if env:
        defaults["env"] = {"OMP_NUM_THREADS": "1", **env}
    return cr.inventory(name, hosts=2, job={**SCRIPT, **(job or {})}, defaults=defaults,
                        top={"timeouts": FAST, **(top or {})})


def rank_lines(stdout):
    """{rank: host} from each rank's own `rank R/W ... on HOST` line, with the prefix it came under."""
    found = {}
    for m in re.finditer(r"^\[(\S+) r(\d+)\] rank (\d+)/4 local \d on (\S+)", stdout, re.M):
        prefix_host, prefix_rank, rank, hostname = m.groups()
        assert prefix_rank == rank and prefix_host == hostname, m.group(0)
        found[int(rank)] = hostname
    return found


def test_torchrun_style_script_runs_unchanged_on_its_first_launch(cr):
    done = cr.run("launch", two_by_two(cr))  # rank_flags not set: the script's strict argparse has no --rank
    assert done.returncode == 0, done.stderr
    assert "multinode.py parses its own options and declares no --rank/--world-size: they are not passed" in \
        done.stderr
    assert rank_lines(done.stdout) == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    assert all(f"[node{r // 2} r{r}] rank {r} epoch 1 batch 8 sum 10" in done.stdout for r in range(4))


def test_tutorial_flags_on_a_torchrun_style_script_fail_with_the_hint(cr):
    done = cr.run("launch", two_by_two(cr, job={"rank_flags": True}))  # said so: the inventory wins
    assert done.returncode == 1
    assert "unrecognized arguments: --rank" in done.stderr  # the root cause's last lines
    hint = next(line for line in done.stderr.splitlines() if line.startswith("hint:"))
    assert "rank_flags: false" in hint and "launcher: torchrun" in hint


def test_torchrun_per_host_runs_the_same_script(cr, cluster):
    done = cr.run("launch", two_by_two(cr, job={"launcher": "torchrun"}))
    assert done.returncode == 0, done.stderr
    ranks = rank_lines(done.stdout)  # the rendezvous decides where each rank is; each host has two
    assert sorted(ranks) == [0, 1, 2, 3] and sorted(ranks.values()) == ["node0", "node0", "node1", "node1"]
    assert "[node0 torchrun]" in done.stdout or "[node1 torchrun]" in done.stdout  # torchrun's own output
    run = cr.ps()[0]
    assert run["state"] == "succeeded" and {r["host"] for r in run["ranks"]} == {"node0", "node1"}
    assert {r["rank"]: r["host"] for r in run["ranks"]} == ranks  # the registry knows where each rank ran
    logs = cr.run("logs", "--rank", "3").stdout  # kept per rank, prefixed with its real host
    assert f"[{ranks[3]} r3] rank 3 done" in logs


def test_imagenet_style_flags_through_placeholders(cr, cluster):
    inv = two_by_two(cr, job={"script": "imagenet_style.py", "rank_flags": False, "init_method": "tcp",
                              "args": ["--dist-url", "{dist_url}", "--rank", "{rank}", "--world-size",
                                       "{world_size}", "--config", '{"lr": 0.1}']})
    dry = cr.run("launch", "--dry-run", inv)
    addr = cluster.host("node0").address
    assert f"--dist-url tcp://{addr}:29500 --rank 3 --world-size 4" in dry.stdout.replace("'", "")
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    for r in range(4):
        assert f"imagenet-style rank {r}/4 on node{r // 2} url tcp://{addr}:29500 sum 4 config {{\"lr\": 0.1}}" \
            in done.stdout


def test_an_unknown_placeholder_is_an_inventory_error(cr):
    inv = two_by_two(cr, job={"args": ["--x", "{rnak}"]})
    done = cr.run("launch", inv)
    assert done.returncode == 2
    assert re.search(r"inv\.yaml:\d+:\d+: job\.args\[1\]: unknown placeholder \{rnak\}; did you mean \{rank\}",
                     done.stderr), done.stderr


def test_torchrun_restarts_a_worker_that_failed_once(cr):
    inv = two_by_two(cr, job={"launcher": "torchrun", "restarts": 1}, env={"FAIL_ONCE_RANK": "1"})
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    assert "rank 1 failing once" in done.stdout and "restart 1" in done.stdout
    assert "torchrun restarted its workers (restart 1 of 1)" in done.stderr
    hosts = cr.ps()[0]["hosts"]
    assert max(h["restarts"] for h in hosts) == 1


def test_torchrun_failure_tears_down_every_worker_and_names_the_exception(cr, cluster):
    inv = two_by_two(cr, job={"launcher": "torchrun"}, env={"FAIL_RANK": "3"})
    done = cr.run("launch", inv)
    assert done.returncode == 1
    assert "error: RuntimeError: rank 3 fails on purpose" in done.stderr
    assert re.search(r"rank 3 on node\d: exit code 1", done.stderr)
    time.sleep(1)
    assert cluster.orphans() == []


@pytest.mark.parametrize("how", ["ctrl-c", "time-limit", "stop"])
def test_torchrun_is_ended_with_all_its_workers(cr, cluster, how):
    job = {"launcher": "torchrun", **({"time_limit": "12s"} if how == "time-limit" else {})}
    inv = two_by_two(cr, job=job, env={"SLEEP": "600"})
    if how == "stop":
        start = cr.run("launch", "--detach", inv)
        assert start.returncode == 0, start.stderr
        run_id = start.stdout.strip()
    else:
        proc = cr.popen("launch", inv)
    wait_for(lambda: len([p for p in cluster.orphans() if "multinode.py" in p.args]) >= 8, timeout=60,
             what="4 workers (shim and script) running")
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
    if how == "stop":
        assert cr.run("stop", run_id).returncode == 0
        code = cr.ps()[0]["exit_code"]
    else:
        proc.communicate(timeout=60)
        code = proc.returncode
    assert code == {"ctrl-c": 130, "time-limit": 4, "stop": 1}[how]
    wait_for(lambda: cluster.orphans() == [], timeout=15, what="nothing left on any host")


def test_setup_runs_once_per_content_and_a_failing_setup_starts_nothing(cr, cluster, tmp_path):
    root = write_tree(tmp_path / "proj", {"multinode.py": (cr.jobs / "multinode.py").read_text(),
                                          "requirements.txt": "numpy\n",
                                          "token": uuid.uuid4().hex})  # content no earlier test run had: no cached setup
    for host in ("node0", "node1"):
        cluster.exec(host, ["rm", "-f", "/home/cr/setup-runs.txt"])
    setup = ["echo preparing $CLUSTERRUN_NODE_NAME with $CLUSTERRUN_PYTHON",
             "cat requirements.txt >> ~/setup-runs.txt"]
    inv = two_by_two(cr, job={"root": str(root), "sync": ["requirements.txt", "token"], "rank_flags": False,
                              "setup": setup})
    first = cr.run("launch", inv)
    assert first.returncode == 0, first.stderr
    assert "[node0 setup] preparing node0 with /opt/venv/bin/python" in first.stdout
    second = cr.run("launch", inv)
    assert second.returncode == 0, second.stderr
    assert "[node0 setup]" not in second.stdout and "node1: setup unchanged since" in second.stderr
    (root / "requirements.txt").write_text("numpy\ntorch\n")
    third = cr.run("launch", inv)
    assert third.returncode == 0 and "[node1 setup] preparing node1" in third.stdout
    for host in ("node0", "node1"):
        rc, out, _ = cluster.exec(host, ["cat", "/home/cr/setup-runs.txt"])
        assert out == "numpy\nnumpy\ntorch\n"  # twice, not three times
        cluster.exec(host, ["rm", "-f", "/home/cr/setup-runs.txt"])
    failing = two_by_two(cr, "failing.yaml", job={"root": str(root), "rank_flags": False,
                                                  "setup": ["echo about to fail", "exit 3"]})
    done = cr.run("launch", failing)
    assert done.returncode == 1
    assert "setup failed on 2 hosts; nothing was started" in done.stderr
    assert "node0: setup failed: job.setup[1]: exit 3 (exit 3)\n      | $ echo about to fail\n      | about to fail" \
        in done.stderr
    run = cr.ps()[0]
    assert {r["state"] for r in run["ranks"]} == {"not-started"}
    assert run["id"] not in cr.run_dirs("node0") + cr.run_dirs("node1")  # its pushed folders are gone


def test_exec_folds_identical_output_and_says_who_failed(cr, cluster):
    inv = cr.inventory(top={"timeouts": FAST})
    same = cr.run("exec", inv, "--", "python3", "-c", "print('same everywhere')")
    assert same.returncode == 0 and same.stdout == "[node[0-3]] same everywhere\n"
    names = cr.run("exec", inv, "--hosts", "node1,node3", "--", "hostname")
    assert names.returncode == 0 and names.stdout.splitlines() == ["[node1] node1", "[node3] node3"]
    odd = cr.run("exec", inv, "--", "sh", "-c", "test $(hostname) != node2 && echo fine")
    assert odd.returncode == 1 and "[node[0-1,3]] fine" in odd.stdout
    assert re.search(r"node2\s+│\s+1", odd.stderr), odd.stderr
    as_json = json.loads(cr.run("exec", inv, "--json", "--", "sh", "-c", "echo $1 >&2; exit 4", "-", "x").stdout)
    assert [(h["host"], h["exit_code"], h["stderr"]) for h in as_json] == [(f"node{i}", 4, "x\n") for i in range(4)]
    cluster.pause("node3")
    try:
        down = cr.run("exec", inv, "--", "true")
    finally:
        cluster.unpause("node3")
    assert down.returncode == 3 and "node3" in down.stderr and "unreachable" in down.stderr
