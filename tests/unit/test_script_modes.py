"""The three ways to start other people's scripts, placeholders, setup keys, exec's folding (pure)."""

import pytest

from clusterrun.config.inventory import parse_inventory, with_overrides
from clusterrun.config.placeholders import check, names_in, render
from clusterrun.errors import InventoryError, UsageError
from clusterrun.outcome import RankResult, hint_for
from clusterrun.plan import build_plan, node_command, setup_request
from clusterrun.states import RankState
from clusterrun.ui.tables import fold_outputs, host_ranges

HOSTS = "hosts:\n  - {name: a, host: 10.0.0.1, slots: 2}\n  - {name: b, host: 10.0.0.2, slots: 2}\n"


def inv(tmp_path, job, extra=""):
    (tmp_path / "train.py").write_text("")
    return parse_inventory(f"version: 1\n{HOSTS}job: {job}\n{extra}", str(tmp_path / "inv.yaml"))


def test_placeholders_render_and_leave_other_braces_alone():
    values = {"rank": 3, "world_size": 4, "dist_url": "tcp://h:1"}
    assert render("--rank={rank}/{world_size}", values) == "--rank=3/4"
    assert render('{"lr": 0.1}', values) == '{"lr": 0.1}'
    assert render('{"a": {"b": 1}}', values) == '{"a": {"b": 1}}'  # nested JSON too
    assert render("{{rank}}", values) == "{rank}" and render("{{}}", values) == "{}"
    assert render("{{{rank}}}", values) == "{3}"
    assert render("{Rank} {rank-1} {}", values) == "{Rank} {rank-1} {}"  # not a lowercase identifier
    assert names_in("{dist_url} {{x}} {y}") == ["dist_url", "y"]
    assert "did you mean {rank}" in check("{rnak}") and check("{rank}") is None
    assert "torchrun" in check("{local_rank}", per_worker_ok=False)


def test_tutorial_flags_env_only_and_module(tmp_path):
    tutorial = build_plan(inv(tmp_path, "{script: train.py, args: [--lr, '0.1']}"), "r")
    assert tutorial.ranks[3].argv[1:] == ("train.py", "--rank", "3", "--world-size", "4", "--lr", "0.1")
    env_only = build_plan(inv(tmp_path, "{script: train.py, rank_flags: false, args: [x]}"), "r")
    assert env_only.ranks[3].argv[1:] == ("train.py", "x")
    assert env_only.ranks[3].env["RANK"] == "3" and env_only.ranks[3].env["LOCAL_RANK"] == "1"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("")
    module = build_plan(inv(tmp_path, "{module: pkg.train, rank_flags: false}"), "r")
    assert module.ranks[0].argv[1:] == ("-m", "pkg.train")


def test_placeholders_in_args_and_env_are_rendered_per_rank(tmp_path):
    i = inv(tmp_path, "{script: train.py, rank_flags: false, init_method: tcp, args: "
                      "[--dist-url, '{dist_url}', --rank, '{rank}', --world-size, '{world_size}']}",
            "defaults: {env: {SHARD: 'part-{node_rank}-{local_rank}', RUN: '{run_id}'}}\nmaster: {port: 29600}\n")
    plan = build_plan(i, "20261201-000000-abcd")
    r = plan.ranks[3]
    assert r.argv[2:] == ("--dist-url", "tcp://10.0.0.1:29600", "--rank", "3", "--world-size", "4")
    assert r.env["SHARD"] == "part-1-1" and r.env["RUN"] == "20261201-000000-abcd"


def test_torchrun_per_host(tmp_path):
    plan = build_plan(inv(tmp_path, "{script: train.py, launcher: torchrun, restarts: 2, args: ['{nnodes}']}",
                          "master: {port: 29700}\n"), "rid")
    b = plan.nodes[1]
    line = node_command(b)
    assert line[1:3] == ("-m", "torch.distributed.run")
    opts = dict(zip(line[3::2], line[4::2]))
    assert opts["--nnodes"] == "2" and opts["--node-rank"] == "1" and opts["--nproc-per-node"] == "2"
    assert opts["--rdzv-backend"] == "c10d" and opts["--rdzv-endpoint"] == "10.0.0.1:29700"
    assert opts["--rdzv-id"] == "rid" and opts["--max-restarts"] == "2" and opts["--local-addr"] == "10.0.0.2"
    assert b.entry == ("train.py", "2")  # no --rank: torchrun's workers read it from their environment
    assert "RANK" not in b.env and b.env["CLUSTERRUN_NODE_NAME"] == "b"


def test_inventory_errors_for_the_new_keys(tmp_path):
    with pytest.raises(InventoryError) as info:
        inv(tmp_path, "{script: train.py, module: pkg.x, launcher: torchrun, rank_flags: true, init_method: tcp, "
                      "args: ['{rank}', '{rnk}'], setup: ['']}")
    text = str(info.value)
    for wanted in ("job.module: give job.script or job.module, not both", "job.rank_flags: launcher: torchrun",
                   "job.init_method: launcher: torchrun", "job.args[0]: {rank} cannot be rendered",
                   "job.args[1]: unknown placeholder {rnk}; did you mean {rank}?", "job.setup[0]: must not be empty"):
        assert wanted in text, wanted
    assert "inv.yaml:" in text
    with pytest.raises(UsageError, match="unknown placeholder {wrold_size}"):
        with_overrides(inv(tmp_path, "{script: train.py}"), args=["{wrold_size}"])


def test_setup_key_follows_commands_files_and_python(tmp_path):
    i = inv(tmp_path, "{script: train.py, setup: ['pip install -r requirements.txt']}")
    plan = build_plan(i, "r")
    files = {"files": [["train.py", "a" * 64, 1, False]]}
    key = setup_request(i, plan, plan.nodes[0], files, {})["key"]
    assert setup_request(i, plan, plan.nodes[1], files, {})["key"] == key  # same host python, same files
    assert setup_request(i, plan, plan.nodes[0], {"files": [["train.py", "b" * 64, 1, False]]}, {})["key"] != key
    request = setup_request(i, plan, plan.nodes[1], files, {})
    assert request["env"]["CLUSTERRUN_NODE_RANK"] == "1" and "RANK" not in request["env"]


def test_exec_folding_and_host_ranges():
    assert host_ranges(["node0", "node1", "node2", "gpu1"]) == "node[0-2],gpu1"
    assert host_ranges(["node1", "node3", "node4"]) == "node[1,3-4]"
    assert host_ranges(["n01", "n02"]) == "n01,n02" and host_ranges(["solo"]) == "solo"
    assert fold_outputs([("a", b"x"), ("b", b"y"), ("c", b"x")]) == [(["a", "c"], b"x"), (["b"], b"y")]


def test_hint_for_a_script_that_does_not_take_rank_flags():
    tail = ("usage: multinode.py [-h] [--batch_size BATCH_SIZE] total_epochs save_every",
            "multinode.py: error: unrecognized arguments: --rank --world-size 3 1")
    hint = hint_for(RankResult(0, 0, "a", RankState.FAILED, exit_code=2, tail=tail))
    assert "rank_flags: false" in hint and "launcher: torchrun" in hint
    assert hint_for(RankResult(0, 0, "a", RankState.FAILED, exit_code=1, tail=("boom",))) == ""


TORCHRUN_STYLE = """import argparse, os
p = argparse.ArgumentParser()
p.add_argument("total_epochs", type=int)
p.add_argument("--batch_size", type=int, default=32)
args = p.parse_args()
rank = int(os.environ["RANK"])
"""


def test_rank_flags_left_open_are_decided_from_the_script(tmp_path):
    from clusterrun.config.inventory import with_rank_flags_decided

    def decided(source, job="{script: train.py}"):
        i = inv(tmp_path, job)
        (tmp_path / "train.py").write_text(source)
        return with_rank_flags_decided(i).job

    torchrun_style = decided(TORCHRUN_STYLE)  # strict argparse, no --rank: passing it would fail the script
    assert (torchrun_style.rank_flags, torchrun_style.rank_flags_from) == (False, "script")
    tutorial = decided(TORCHRUN_STYLE + 'p.add_argument("--rank", type=int)\np.add_argument("--world-size")\n')
    assert (tutorial.rank_flags, tutorial.rank_flags_from) == (True, "default")
    assert decided("import sys\nprint(sys.argv)\n").rank_flags  # reads argv itself: given the flags as before
    assert decided(TORCHRUN_STYLE.replace("parse_args()", "parse_known_args()")).rank_flags  # unknown flags pass
    click_style = decided("import click\n@click.command()\n@click.option('--epochs')\ndef main(epochs): pass\n")
    assert not click_style.rank_flags
    assert decided(TORCHRUN_STYLE, "{script: train.py, rank_flags: true}").rank_flags  # the inventory wins
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "train.py").write_text(TORCHRUN_STYLE)
    assert not with_rank_flags_decided(inv(tmp_path, "{module: pkg.train}")).job.rank_flags  # the module's file
    plan = build_plan(replace_job(inv(tmp_path, "{script: train.py, args: ['3']}"), torchrun_style), "r")
    assert plan.ranks[1].argv[1:] == ("train.py", "3")


def replace_job(i, job):
    from dataclasses import replace

    return replace(i, job=replace(job, args=i.job.args))


def test_a_script_that_sets_the_rendezvous_itself_is_named_before_the_launch(tmp_path):
    """The DDP tutorial's setup() hard-codes MASTER_ADDR='localhost' and a port: on several hosts the ranks
    loop on "failed to connect to [localhost]:12355" until torch's 30-minute default (issue 36)."""
    from clusterrun.config.job import rendezvous_overrides

    job = inv(tmp_path, "{script: train.py}").job
    (tmp_path / "train.py").write_text("import os\ndef setup(rank, world_size):\n"
                                       "    os.environ['MASTER_ADDR'] = 'localhost'  # tutorial\n"
                                       '    os.environ["MASTER_PORT"]="12355"\n'
                                       "    if os.environ['MASTER_ADDR'] == 'x': pass\n"
                                       "    url = 'tcp://127.0.0.1:23456'\n")
    found = rendezvous_overrides(job, hosts=2)
    assert [w.split(" ", 1)[0] for w in found] == ["train.py:3", "train.py:4", "train.py:6"], found
    assert "sets MASTER_ADDR = 'localhost' itself" in found[0] and "os.environ.setdefault" in found[0]
    assert "sets MASTER_PORT = \"12355\" itself" in found[1]
    assert "names this machine in a tcp:// init_method (127.0.0.1)" in found[2]
    assert [w.split(" ", 1)[0] for w in rendezvous_overrides(job, hosts=1)] == ["train.py:4"]  # one host
    (tmp_path / "train.py").write_text("os.environ.setdefault('MASTER_ADDR', 'localhost')\n")
    assert rendezvous_overrides(job, hosts=2) == []
    # and when it happened anyway: the root cause names it
    failed = RankResult(2, 1, "b", RankState.FAILED, exit_code=1, tail=(
        "[W socket.cpp:755] [c10d] The client socket has failed to connect to [localhost]:12355 (errno: 111).",
        "torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to "
        "connect to (localhost, 12355)."))
    assert "looked for rank 0 at localhost:12355, its own host" in hint_for(failed)
