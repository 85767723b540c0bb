"""One outcome: the live monitor and the registry (`ps`, `stop`) describe the same rank the same way."""

import time

from clusterrun.check.rules import CHECKS
from clusterrun.check.doctor import JUDGES
from clusterrun.outcome import EndedBy, RankResult, decide
from clusterrun.runs.reconcile import conclude
from clusterrun.registry.store import RunStore
from clusterrun.states import RankState, RunState


def _record(store, states):
    store.create("20261201-000000-0001", "inv.yaml", {}, {"nodes": []}, {}, [{"node_rank": 0, "name": "a"}],
                 [{"rank": r, "node_rank": 0, "host": "a"} for r in range(len(states))])
    for rank, (state, fields) in enumerate(states):
        store.update_rank("20261201-000000-0001", rank, state=state, **fields)


def test_a_sigkilled_rank_reads_the_same_live_and_in_ps(tmp_path):
    now = time.time()
    store = RunStore(str(tmp_path))
    _record(store, [(RankState.STOPPED, {"signal": 15, "ended_at": now + 1}),
                    (RankState.FAILED, {"signal": 9, "ended_at": now})])
    record = conclude(store, "20261201-000000-0001")
    live = decide("r", [RankResult(0, 0, "a", RankState.STOPPED, signal=15, ended_at=now + 1),
                        RankResult(1, 0, "a", RankState.FAILED, signal=9, ended_at=now)], ended_by=EndedBy.FAILURE)
    assert record.state is RunState.FAILED and live.state is RunState.FAILED
    assert record.reason == live.reason == "rank 1 on a: killed by signal 9 (SIGKILL)"
    assert record.exit_code == live.exit_code == 1


def test_root_cause_is_the_earliest_failure_then_the_lowest_rank():
    t = time.time()
    ranks = [RankResult(0, 0, "a", RankState.FAILED, exit_code=1, ended_at=t + 2),
             RankResult(1, 0, "a", RankState.LOST, note="host lost", ended_at=t + 1),
             RankResult(2, 1, "b", RankState.FAILED, exit_code=3, ended_at=t + 1)]
    verdict = decide("r", ranks)
    assert verdict.root_cause.rank == 1 and "lost (host lost)" in verdict.reason


def test_open_runs_have_no_verdict_unless_clusterrun_ended_them():
    ranks = [RankResult(0, 0, "a", RankState.RUNNING), RankResult(1, 0, "a", RankState.SUCCEEDED)]
    assert decide("r", ranks) is None
    assert decide("r", ranks, ended_by=EndedBy.TIME_LIMIT, time_limit=10).state is RunState.TIMED_OUT
    assert decide("r", ranks, ended_by=EndedBy.INTERRUPT).exit_code == 130


def test_every_check_column_has_a_judge():
    assert CHECKS == ("ssh",) + tuple(JUDGES)


def test_a_hosts_exit_record_lands_on_the_controllers_clock_once():
    """RankResult.from_exit is the one place a host's clock is corrected (monitor, ps and stop all use it)."""
    from clusterrun.outcome import RankResult as R

    host_now = time.time() + 100.0  # that host's clock runs 100 s ahead
    info = {"rank": 3, "exit_code": 1, "signal": None, "started_at": host_now - 10, "ended_at": host_now,
            "stopped": False, "error": "boom"}
    r = R.from_exit(3, 1, "b", info, clock_offset=100.0, log_path="/l")
    assert abs(r.ended_at - (host_now - 100)) < 1e-6 and abs(r.started_at - (host_now - 110)) < 1e-6
    assert r.state is RankState.FAILED and r.note == "boom" and r.duration == 10.0


def test_stop_records_exits_with_the_hosts_clock(tmp_path):
    """`stop`'s answer carries the host's `now`: what it reports is moved to this clock like `ps` does."""
    from clusterrun.runs.nodes import Node
    from clusterrun.runs.reconcile import record_exits
    from hostkit import make_host

    store = RunStore(str(tmp_path))
    _record(store, [(RankState.RUNNING, {})])
    host_now = time.time() + 50.0
    node = Node(0, make_host(tmp_path / "work"), (0,), 0)
    record_exits(store, "20261201-000000-0001", node, {"0": {"exit_code": None, "signal": 15, "stopped": True,
                                                            "ended_at": host_now, "started_at": host_now - 5}},
                 host_now)
    rank = store.get("20261201-000000-0001").ranks[0]
    assert rank.state is RankState.STOPPED and abs(rank.ended_at - (host_now - 50)) < 1.0


def test_a_stopped_rank_says_who_stopped_it_and_why():
    cause = RankResult(2, 1, "node1", RankState.FAILED, exit_code=2, ended_at=10.0)

    def stopped(**kw):
        return RankResult(0, 0, "node0", RankState.STOPPED, **kw)

    # stopped after a peer failed: named as such, not as if clusterrun had ended it for no reason
    assert stopped(signal=15, stop_reason="failed").describe(cause) == \
        "stopped by clusterrun after rank 2 on node1 failed (SIGTERM)"
    assert stopped(signal=15, stop_reason="failed elsewhere: rank 2 on node1: exit code 1").describe() == \
        "stopped by clusterrun after rank 2 on node1: exit code 1 (SIGTERM)"
    # an exit code of its own after the stop is not clusterrun's exit code
    assert stopped(exit_code=2, stop_reason="failed").describe(cause) == \
        "stopped by clusterrun after rank 2 on node1 failed (told to stop, it exited with code 2)"
    assert stopped(signal=15, stop_reason="time-limit").describe() == \
        "stopped by clusterrun at the time limit (SIGTERM)"
    assert stopped(signal=15, stop_reason="stopped").describe() == "stopped by `clusterrun stop` (SIGTERM)"
    assert stopped(signal=9, stop_reason="interrupted").describe() == "stopped by clusterrun on Ctrl-C (SIGKILL)"
    # a rank that failed on its own is not blamed on the root cause (the same missing torch fails them all)
    later = RankResult(3, 1, "node1", RankState.FAILED, exit_code=1, ended_at=10.001)
    assert later.describe(cause) == "exit code 1" and cause.describe(cause) == "exit code 2"


def test_root_cause_hints_for_a_python_without_torch_and_a_taken_port():
    from clusterrun.outcome import hint_for

    def hint(*tail):
        return hint_for(RankResult(0, 0, "a", RankState.FAILED, exit_code=1, tail=tail))

    torch = hint("Traceback (most recent call last):", "ModuleNotFoundError: No module named 'torch'")
    assert "has no torch" in torch and "python:" in torch and "clusterrun check INVENTORY" in torch  # (the view
    # names the inventory)
    assert "lacks the module yaml" in hint("ModuleNotFoundError: No module named 'yaml'")
    assert "master: {port: auto}" in hint("error: [... code: -98, name: EADDRINUSE, message: address already in use]")


def test_root_cause_hints_for_positional_argv_and_the_abort_at_exit():
    """Two causes the first hour met with only "exit code 1" / "signal SIGABRT" to go on (issue 36)."""
    import signal

    from clusterrun.outcome import hint_for

    positional = hint_for(RankResult(0, 0, "a", RankState.FAILED, exit_code=1, tail=(
        "Traceback (most recent call last):", '  File "train.py", line 5, in <module>',
        "    epochs = int(sys.argv[1])", "ValueError: invalid literal for int() with base 10: '--rank'")))
    assert "reads its arguments by position" in positional and "got --rank there" in positional
    assert "job.rank_flags: false" in positional and "{rank}" in positional
    aborted = RankResult(1, 1, "b", RankState.FAILED, signal=signal.SIGABRT, tail=(
        "epoch 2 done, accuracy 0.97", "terminate called without an active exception"))
    assert "torch.distributed.destroy_process_group()" in hint_for(aborted)
    # the same words from a rank that ended with an exit code are not this (its own C++ code threw)
    assert "destroy_process_group" not in hint_for(RankResult(1, 1, "b", RankState.FAILED, exit_code=1,
                                                              tail=aborted.tail))
