"""One outcome: the live monitor and the registry (`ps`, `stop`) describe the same rank the same way."""

import time

from clusterrun.check.rules import CHECKS
from clusterrun.check.run import JUDGES
from clusterrun.outcome import RankResult, decide
from clusterrun.registry.runs import conclude
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
    live = decide([RankResult(0, 0, "a", RankState.STOPPED, signal=15, ended_at=now + 1),
                   RankResult(1, 0, "a", RankState.FAILED, signal=9, ended_at=now)], stop_reason="failed")
    assert record.state is RunState.FAILED and live.state is RunState.FAILED
    assert record.reason == live.reason == "rank 1 on a: killed by signal 9 (SIGKILL)"
    assert record.exit_code == live.exit_code == 1


def test_root_cause_is_the_earliest_failure_then_the_lowest_rank():
    t = time.time()
    ranks = [RankResult(0, 0, "a", RankState.FAILED, exit_code=1, ended_at=t + 2),
             RankResult(1, 0, "a", RankState.LOST, note="host lost", ended_at=t + 1),
             RankResult(2, 1, "b", RankState.FAILED, exit_code=3, ended_at=t + 1)]
    verdict = decide(ranks)
    assert verdict.root_cause.rank == 1 and "lost (host lost)" in verdict.reason


def test_open_runs_have_no_verdict_unless_clusterrun_ended_them():
    ranks = [RankResult(0, 0, "a", RankState.RUNNING), RankResult(1, 0, "a", RankState.SUCCEEDED)]
    assert decide(ranks) is None
    assert decide(ranks, stop_reason="time-limit", time_limit=10).state is RunState.TIMED_OUT
    assert decide(ranks, stop_reason="interrupted").exit_code == 130


def test_every_check_column_has_a_judge():
    assert CHECKS == ("ssh",) + tuple(JUDGES)
