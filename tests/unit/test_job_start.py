"""job.start (issue 35) without a network: the inventory keys and their problems (file:line:col), the
steps of a start and the dry run's account of them, the walk through the steps (each host's start, the
gaps, a stop in the middle), the live view's line, what a host's start gets, and a host's ranks started
one after another by the real host program."""

import sys

import pytest
from rich.console import Console

from clusterrun.config.inventory import parse_inventory
from clusterrun.errors import InventoryError
from clusterrun.events import Starting
from clusterrun.launch.spec import host_spec
from clusterrun.launch.start import order_lines, start_all, start_steps
from clusterrun.plan import build_plan, plan_to_dict
from clusterrun.ui.tables import show_plan
from hostkit import project, spec

INV = """\
version: 1
hosts:
  - {name: n0, host: 10.0.0.10, slots: 2}
  - {name: n1, host: 10.0.0.11}
  - {name: n2, host: 10.0.0.12}
job:
  script: train.py
%s"""


def inv(tmp_path, start=""):
    (tmp_path / "train.py").write_text("print(1)\n")
    return parse_inventory(INV % start, str(tmp_path / "inv.yaml"))


def problems(tmp_path, start):
    with pytest.raises(InventoryError) as err:
        inv(tmp_path, start)
    return str(err.value)


def test_the_default_is_every_host_at_once(tmp_path):
    job = inv(tmp_path).job
    assert (job.start_order, job.start_gap_s) == ("all", 0.0)
    plan = build_plan(inv(tmp_path), "20261202-000000-0001")
    assert plan_to_dict(plan)["start"] == {"order": "all", "gap_s": 0.0}
    assert order_lines(plan) == ["# start: every host at once (job.start.order: all)"]


def test_order_rank_with_a_gap_and_its_default_gap(tmp_path):
    assert (inv(tmp_path, "  start: {order: rank, gap: 2s}\n").job.start_gap_s) == 2.0
    assert inv(tmp_path, "  start: {order: rank}\n").job.start_gap_s == 1.0
    assert inv(tmp_path, "  start: {order: rank, gap: 0}\n").job.start_gap_s == 0.0


@pytest.mark.parametrize("start, words", [
    ("  start: {order: ranks}\n", "inv.yaml:8:18: job.start.order: must be one of all, rank; got 'ranks'"),
    ("  start: {order: rank, gap: soon}\n", "inv.yaml:8:29: job.start.gap: expected a duration"),
    ("  start: {gap: 2s}\n", "inv.yaml:8:16: job.start.gap: applies to order: rank only"),
    ("  start: {order: rank, wait: 2s}\n", "inv.yaml:8:24: job.start.wait: unknown key 'wait'"),
    ("  start: rank\n", "inv.yaml:8:10: job.start: expected a mapping"),
])
def test_a_bad_start_names_file_line_column_and_key(tmp_path, start, words):
    assert words in problems(tmp_path, start)


def test_all_at_once_starts_rank_0s_host_first_unless_it_already_listens(tmp_path):
    plan = build_plan(inv(tmp_path), "20261202-000000-0001")
    names = [[n.host.name for n in s.nodes] for s in start_steps(plan, coordinator_ready=True)]
    assert names == [["n0", "n1", "n2"]]
    steps = start_steps(plan, coordinator_ready=False)
    assert [[n.host.name for n in s.nodes] for s in steps] == [["n0"], ["n1", "n2"]]
    assert all(s.gap_after_s == 0 for s in steps)


def test_rank_order_is_one_host_a_step_with_the_gap_after_each_but_the_last(tmp_path):
    plan = build_plan(inv(tmp_path, "  start: {order: rank, gap: 3s}\n"), "20261202-000000-0001")
    steps = start_steps(plan, coordinator_ready=True)
    assert [([n.host.name for n in s.nodes], s.gap_after_s) for s in steps] == [(["n0"], 3.0), (["n1"], 3.0),
                                                                                (["n2"], 0.0)]


def test_the_dry_run_shows_each_ranks_earliest_start(tmp_path):
    plan = build_plan(inv(tmp_path, "  start: {order: rank, gap: 2s}\n"), "20261202-000000-0001")
    assert order_lines(plan) == [
        "# start: in rank order, host after host, 2 s after the one before has started its ranks (job.start)",
        "#   +0 s  n0 r0", "#   +2 s  n0 r1", "#   +4 s  n1 r2", "#   +6 s  n2 r3"]
    out = Console(record=True, width=200)
    show_plan(plan, out)
    assert "#   +6 s  n2 r3" in out.export_text()


def walk(tmp_path, start, stop_after=None):
    plan = build_plan(inv(tmp_path, start), "20261202-000000-0001")
    started, events, naps = [], [], []

    def begin(nodes):
        started.append([n.host.name for n in nodes])

    done = start_all(plan, start_steps(plan, True), begin, stopped=lambda: stop_after is not None and
                     len(started) >= stop_after, emit=events.append, sleep=naps.append)
    return done, started, events, naps


def test_the_walk_starts_each_host_in_turn_and_says_which(tmp_path):
    done, started, events, naps = walk(tmp_path, "  start: {order: rank, gap: 0.2s}\n")
    assert done and started == [["n0"], ["n1"], ["n2"]]
    assert events == [Starting("n0", "r0-r1", 1, 3, 0.0), Starting("n1", "r2", 2, 3, 0.2),
                      Starting("n2", "r3", 3, 3, 0.2)]
    assert events[1].describe() == ("start: n1 (r2), host 2 of 3 in rank order, 0.2 s after the host before it "
                                    "started its ranks")
    assert naps and max(naps) <= 0.05  # the gap in short naps: a Ctrl-C is heard at once


def test_a_stop_during_the_walk_starts_no_more_hosts(tmp_path):
    done, started, _, _ = walk(tmp_path, "  start: {order: rank, gap: 5s}\n", stop_after=1)
    assert not done and started == [["n0"]]


def test_all_at_once_says_nothing_about_order(tmp_path):
    done, started, events, naps = walk(tmp_path, "")
    assert done and started == [["n0", "n1", "n2"]] and events == [] and naps == []


def test_a_host_with_several_ranks_gets_the_gap_for_its_own(tmp_path):
    i = inv(tmp_path, "  start: {order: rank, gap: 2s}\n")
    plan = build_plan(i, "20261202-000000-0001")
    specs = [host_spec(i, plan, n, {}, time_left=None, peer_token="t", coordinator_port=1) for n in plan.nodes]
    assert [s.get("start_gap") for s in specs] == [2.0, None, None]  # one rank: nothing to space out
    plain = build_plan(inv(tmp_path), "20261202-000000-0001")
    assert "start_gap" not in host_spec(inv(tmp_path), plain, plain.nodes[0], {}, time_left=None, peer_token="t",
                                        coordinator_port=1)


def test_the_host_program_starts_a_hosts_ranks_one_after_another(host_client, tmp_path):
    run_id = "20261202-000000-0035"
    host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
    ranks = [(r, [sys.executable, "-c", "import time; time.sleep(30)"]) for r in range(3)]
    state = host_client.start(run_id, spec(run_id, ranks, start_gap=0.4))
    times = [state["ranks"][str(r)]["started_at"] for r in range(3)]
    assert all(b - a >= 0.4 for a, b in zip(times, times[1:])), times
    host_client.stop(run_id, 1.0)


def test_a_stop_between_two_ranks_starts_no_more(host_client, tmp_path):
    import threading

    run_id = "20261202-000000-0036"
    host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
    ranks = [(r, [sys.executable, "-c", "import time; time.sleep(30)"]) for r in range(3)]
    run_dir = tmp_path / "work" / "runs" / run_id
    timer = threading.Timer(1.0, lambda: (run_dir / "stop.json").write_text('{"reason": "stopped"}'))
    timer.start()
    try:
        state = host_client.start(run_id, spec(run_id, ranks, start_gap=3.0))
    finally:
        timer.cancel()
    assert list(state["ranks"]) == ["0"]  # ranks 1 and 2 never started
    host_client.stop(run_id, 1.0)

