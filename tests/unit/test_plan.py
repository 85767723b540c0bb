"""The launch plan: ranks across uneven slots, torchrun's env, init URLs, quoting of hostile values."""

import shlex
import subprocess
import sys
import textwrap

import pytest

from clusterrun.errors import UsageError
from clusterrun.config.inventory import parse_inventory
from clusterrun.plan import MASK, build_plan, plan_to_dict, rank_env, render_rank_command

RUN = "20261130-142233-a1b2"


def inventory(extra="", hosts="[{host: a, slots: 2}, {host: b, slots: 1}, {host: c, slots: 3}]"):
    text = f"version: 1\ndefaults: {{python: /usr/bin/python3}}\nhosts: {hosts}\njob: {{script: train.py, args: [--lr, '0.1']}}\n{extra}"
    return parse_inventory(text, "/proj/inv.yaml")


def test_ranks_follow_node_order_times_slots():
    plan = build_plan(inventory(), RUN)
    assert plan.world_size == 6
    got = [(r.rank, r.node_rank, r.local_rank, r.host_name) for r in plan.ranks]
    assert got == [(0, 0, 0, "a"), (1, 0, 1, "a"), (2, 1, 0, "b"), (3, 2, 0, "c"), (4, 2, 1, "c"), (5, 2, 2, "c")]


def test_env_is_torchruns_contract():
    plan = build_plan(inventory(), RUN)
    r4 = plan.ranks[4]
    env = r4.env
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                 "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "4", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "2",
        "GROUP_WORLD_SIZE": "3", "MASTER_ADDR": "a", "MASTER_PORT": "29500"}
    assert env["CLUSTERRUN_DIST_URL"] == "env://"
    assert env["CLUSTERRUN_TIMEOUT"] == "1800"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert r4.argv == ("/usr/bin/python3", "train.py", "--rank", "4", "--world-size", "6", "--lr", "0.1")


def test_master_addr_is_rank0_addr_and_init_urls():
    hosts = "[{host: 10.0.0.10, addr: 192.168.1.10}, {host: 10.0.0.11}]"
    assert build_plan(inventory("", hosts), RUN).master_addr == "192.168.1.10"
    inv = parse_inventory("version: 1\nhosts: [{host: h, addr: 'fe80::1'}]\nmaster: {port: 1234}\n"
                          "job: {script: t.py, init_method: tcp}\n", "/p/i.yaml")
    assert build_plan(inv, RUN).init_url == "tcp://[fe80::1]:1234"
    inv = parse_inventory("version: 1\nhosts: [{host: h}]\njob: {script: t.py, init_method: file, shared_dir: /nfs/x/}\n",
                          "/p/i.yaml")
    assert build_plan(inv, RUN).init_url == f"file:///nfs/x/clusterrun-{RUN}.init"


def test_auto_port_is_a_placeholder_until_resolved():
    inv = inventory("master: {port: auto}\n")
    assert build_plan(inv, RUN).ranks[0].env["MASTER_PORT"] == "auto"
    assert build_plan(inv, RUN, master_port=40123).ranks[0].env["MASTER_PORT"] == "40123"


def test_env_may_not_set_contract_variables():
    with pytest.raises(UsageError, match="env sets RANK"):
        build_plan(inventory(hosts="[{host: a, env: {RANK: '3'}}]"), RUN)


def test_user_env_overrides_soft_defaults_only():
    plan = build_plan(inventory(hosts="[{host: a, env: {PYTHONUNBUFFERED: '0', X: y}}]"), RUN)
    assert plan.ranks[0].env["PYTHONUNBUFFERED"] == "0" and plan.ranks[0].env["X"] == "y"


HOSTILE = ["a b", "$(id)", "'", '"', "`id`", "a;b", "new\nline", "*", "~", "-rf", "\\", "$HOME", ""]


def test_hostile_values_reach_the_rank_byte_exact_through_the_rendered_line(tmp_path):
    """The dry-run's rendered command, run by a real shell, hands the rank exactly what the plan says."""
    text = textwrap.dedent(f"""\
        version: 1
        hosts: [{{connection: local, env: {{HOSTILE: "$(touch {tmp_path}/pwned) 'q' \\"d\\" `id`"}}}}]
        job: {{script: show.py}}
        """)
    inv = parse_inventory(text, str(tmp_path / "inv.yaml"), local_python=sys.executable)
    from dataclasses import replace
    inv = replace(inv, job=replace(inv.job, args=tuple(HOSTILE)))
    plan = build_plan(inv, RUN)
    node, rank = plan.nodes[0], plan.ranks[0]
    job_dir = tmp_path / "runs" / RUN / "job"
    job_dir.mkdir(parents=True)
    (job_dir / "show.py").write_text("import json, os, sys\nprint(json.dumps([sys.argv[1:], os.environ['HOSTILE']]))\n")
    line = render_rank_command(plan, node, rank).replace(node.job_dir, str(job_dir))
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout
    import json
    argv, env = json.loads(out)
    assert argv == ["--rank", "0", "--world-size", "1"] + HOSTILE
    assert env == f"$(touch {tmp_path}/pwned) 'q' \"d\" `id`"
    assert not (tmp_path / "pwned").exists()


def test_secrets_are_masked_in_rendering_and_absent_from_the_plan():
    inv = inventory("secrets: [WANDB_API_KEY]\n")
    plan = build_plan(inv, RUN)
    env = rank_env(plan, plan.ranks[0], {"WANDB_API_KEY": "hunter2"})  # the value exists, for the rank only
    assert env["WANDB_API_KEY"] == "hunter2"
    line = render_rank_command(plan, plan.nodes[0], plan.ranks[0])
    assert f"WANDB_API_KEY={MASK}" in line and "hunter2" not in line
    assert "hunter2" not in repr(plan_to_dict(plan)) and "hunter2" not in repr(plan)


def test_run_dir_keeps_tilde_for_the_host_to_expand():
    plan = build_plan(inventory(), RUN)
    assert plan.nodes[0].run_dir == f"~/.clusterrun/runs/{RUN}"
    line = render_rank_command(plan, plan.nodes[0], plan.ranks[0])
    assert line.startswith(f"cd ~/{shlex.quote(f'.clusterrun/runs/{RUN}/job')} && env ")


def test_dry_run_shows_each_hosts_cuda_visible_devices():
    """Named GPUs go into every rank's env in local-rank order; `auto` says they are chosen at launch."""
    from rich.console import Console

    from clusterrun.ui.tables import show_plan

    inv = inventory(hosts="[{host: a, slots: 2, gpus: [2, 3]}, {host: b, slots: 2, gpus: auto},"
                          " {host: c, slots: 1, gpus: [0, 1, 5]}]")
    plan = build_plan(inv, RUN)
    a, b, c = plan.nodes
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in a.ranks] == ["2,3", "2,3"]
    assert "CUDA_VISIBLE_DEVICES" not in b.ranks[0].env and "CUDA_VISIBLE_DEVICES" not in c.ranks[0].env
    assert [n["gpus"] for n in plan_to_dict(plan)["nodes"]] == [[2, 3], "auto", [0, 1, 5]]
    out = Console(width=200, record=True, color_system=None)
    show_plan(plan, out)
    text = out.export_text()
    assert "# a: CUDA_VISIBLE_DEVICES=2,3 (claimed in /tmp/clusterrun-claims)" in text
    assert "# b: CUDA_VISIBLE_DEVICES=<2 free GPUs, chosen at launch>" in text
    assert "# c: CUDA_VISIBLE_DEVICES=<1 free GPUs of 0,1,5, chosen at launch>" in text
    assert "cuda:1 = GPU 3" in text
    assert "CUDA_VISIBLE_DEVICES=2,3 /usr/bin/python3" in render_rank_command(plan, a, a.ranks[1])
