"""launch/restarts.py: whether, where and how the next attempt runs (pure decisions over plan and outcome)."""

from clusterrun.config.inventory import parse_inventory
from clusterrun.launch import restarts
from clusterrun.outcome import RankResult, RunOutcome
from clusterrun.plan import build_plan
from clusterrun.states import RankState, RunState

RUN = "20261201-000000-abcd"


def inventory(job="restarts: 2, min_nodes: 2", master="master: {port: auto}"):
    text = (f"version: 1\ndefaults: {{python: /usr/bin/python3}}\n"
            f"hosts: [{{host: a, slots: 2}}, {{host: b}}, {{host: c}}]\n{master}\n"
            f"job: {{script: train.py, {job}}}\n")
    return parse_inventory(text, "/p/inv.yaml")


def outcome(plan, state=RunState.FAILED, lost=(), failed=()):
    ranks = tuple(RankResult(r.rank, r.node_rank, r.host_name,
                             RankState.LOST if r.host_name in lost else
                             RankState.FAILED if r.rank in failed else RankState.STOPPED) for r in plan.ranks)
    return RunOutcome(RUN, state, 1 if state is RunState.FAILED else 0, "", ranks=ranks)


def test_a_failed_rank_restarts_on_every_host():
    inv = inventory()
    plan = build_plan(inv, RUN, master_port=1234)
    nxt, why = restarts.next_attempt(inv, plan, outcome(plan, failed=(1,)))
    assert (nxt.attempt, nxt.hosts, nxt.dropped, why) == (1, (0, 1, 2), (), "")


def test_lost_hosts_are_dropped_and_ranks_renumbered_with_a_new_master():
    inv = inventory()
    plan = build_plan(inv, RUN, master_port=1234)
    nxt, _ = restarts.next_attempt(inv, plan, outcome(plan, lost=("a",)))
    assert nxt.hosts == (1, 2) and nxt.dropped == ("a dropped: host lost",)
    ports = []
    new = restarts.attempt_plan(inv, RUN, nxt, lambda index: ports.append(index) or 4321)
    assert ports == [1]  # a free port asked of the new rank 0's host
    assert (new.attempt, new.world_size, new.master_addr, new.master_port) == (1, 2, "b", 4321)
    assert [(n.node_rank, n.index, n.host.name, [r.rank for r in n.ranks]) for n in new.nodes] == \
        [(0, 1, "b", [0]), (1, 2, "c", [1])]
    env = new.nodes[1].ranks[0].env
    assert (env["RANK"], env["WORLD_SIZE"], env["NODE_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "2", "1", "2")
    assert (env["CLUSTERRUN_ATTEMPT"], env["TORCHELASTIC_RESTART_COUNT"]) == ("2", "1")
    assert env["CLUSTERRUN_CHECKPOINT_DIR"] == f"~/.clusterrun/runs/{RUN}/checkpoints"
    assert new.attempt_key == f"{RUN}/attempt-2" and new.nodes[0].run_dir.endswith(f"/runs/{RUN}")


def test_a_fixed_master_port_is_kept():
    inv = inventory(master="master: {port: 29511}")
    plan = build_plan(inv, RUN)
    nxt, _ = restarts.next_attempt(inv, plan, outcome(plan, failed=(0,)))
    assert restarts.attempt_plan(inv, RUN, nxt, lambda index: 1 / 0).master_port == 29511


def test_no_restart_when_it_should_not():
    inv = inventory()
    plan = build_plan(inv, RUN, master_port=1234)
    for state in (RunState.SUCCEEDED, RunState.INTERRUPTED, RunState.STOPPED, RunState.TIMED_OUT):
        assert restarts.next_attempt(inv, plan, outcome(plan, state=state)) == (None, "")
    assert restarts.next_attempt(inv, plan, outcome(plan, lost=("a", "b")))[1] == \
        "no restart: 1 host left, job.min_nodes is 2"
    default_min = inventory(job="restarts: 2")  # min_nodes defaults to every host
    plan = build_plan(default_min, RUN, master_port=1234)
    assert restarts.next_attempt(default_min, plan, outcome(plan, lost=("c",)))[1] == \
        "no restart: 2 hosts left, job.min_nodes is 3"
    last = build_plan(inv, RUN, master_port=1234, attempt=2)
    assert restarts.next_attempt(inv, last, outcome(last, failed=(0,)))[1] == \
        "no restart left: 3 attempts made (job.restarts: 2)"
    limited = inventory(job="restarts: 2, time_limit: 60s, restart_delay: 10s")
    plan = build_plan(limited, RUN, master_port=1234)
    assert restarts.next_attempt(limited, plan, outcome(plan, failed=(0,)), elapsed=51)[0] is None
    assert restarts.next_attempt(limited, plan, outcome(plan, failed=(0,)), elapsed=40)[0] is not None


def test_torchrun_restarts_its_own_workers_and_clusterrun_only_lost_hosts():
    inv = inventory(job="launcher: torchrun, restarts: 2, min_nodes: 2")
    plan = build_plan(inv, RUN, master_port=1234)
    assert restarts.next_attempt(inv, plan, outcome(plan, failed=(1,))) == (None, "")
    nxt, _ = restarts.next_attempt(inv, plan, outcome(plan, lost=("c",)))
    new = restarts.attempt_plan(inv, RUN, nxt, lambda index: 4321)
    assert "--nnodes" in new.nodes[0].torchrun and \
        new.nodes[0].torchrun[new.nodes[0].torchrun.index("--nnodes") + 1] == "2"
    first = plan.nodes[0].torchrun
    assert first[first.index("--nnodes") + 1] == "2:3" and first[first.index("--max-restarts") + 1] == "2"


def test_a_hang_restarts_under_torchrun_too():
    """torchrun restarts failed workers itself, but cannot see a hang: clusterrun makes the next attempt."""
    from dataclasses import replace

    inv = inventory(job="launcher: torchrun, restarts: 2")
    plan = build_plan(inv, RUN, master_port=1234)
    hung = replace(outcome(plan), reason="hung: no output for 10m; rank 1 on a in slow_loader (job.py:3)")
    nxt, why = restarts.next_attempt(inv, plan, hung)
    assert nxt is not None and nxt.hosts == (0, 1, 2), why
    assert restarts.next_attempt(inv, plan, outcome(plan, failed=(1,)))[0] is None  # a plain failure: torchrun's
