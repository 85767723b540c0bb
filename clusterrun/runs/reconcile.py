"""ps's reconcile: a recorded run whose controller is gone brought up to date by asking its hosts, and a
run given its end once every rank has one (outcome.py's verdict, the store's `conclude`)."""

from __future__ import annotations

import time
from typing import Callable, Dict, Mapping, Optional, Tuple

from .. import outcome
from ..errors import HostError
from ..hosts.group import on_hosts
from ..outcome import RankResult, RunOutcome
from ..plan import attempt_key
from ..registry.store import RunRecord, RunStore, controller_alive
from ..states import Cleanup, HostState, RankState, RunState
from .nodes import Connect, Node, nodes_of


def conclude(store: RunStore, run_id: str, open_state: RunState = RunState.RUNNING,
             verdict: Callable[..., Optional[RunOutcome]] = outcome.decide) -> RunRecord:
    """Once every rank has an end, give the run its end (outcome.py's verdict); until then, `open_state`."""
    record = store.get(run_id)
    if record.terminal:
        return record
    result = verdict(run_id, record.ranks, stop_note=record.reason or "")
    if result is None:
        if open_state is not record.state:
            store.update_run(run_id, state=open_state)
        return store.get(run_id)
    store.conclude(result, ended_at=max((r.ended_at or 0) for r in record.ranks) or time.time())
    return store.get(run_id)


def record_exits(store: RunStore, run_id: str, node: Node, exits: Mapping[str, dict], now: object,
                 only: Optional[set] = None) -> None:
    """A host's exit records of the node's ranks (a status or stop answer, with the host's clock `now`),
    kept on this machine's clock."""
    offset = (now - time.time()) if isinstance(now, (int, float)) else 0.0
    for rank, info in exits.items():
        if only is None or int(rank) in only:
            store.record_rank(run_id, RankResult.from_exit(int(rank), node.node_rank, node.host.name, info,
                                                           clock_offset=offset))


def reconcile(store: RunStore, run_id: str, connect: Connect) -> Tuple[RunRecord, Dict[str, HostError]]:
    """Bring a run whose controller is gone up to date by asking its hosts."""
    record = store.get(run_id)
    if (record.terminal and not record.cleanup_pending) or controller_alive(record.controller):
        return record, {}
    _, nodes = nodes_of(record)
    key = attempt_key(run_id, record.attempt)
    asked = on_hosts(nodes, connect, lambda node, client: client.status(key), thread_name="status")
    waiting = False
    with store.batch():  # every host's answer in one transaction, not a commit per rank
        for node in nodes:
            if node.host.name in asked.results:
                waiting = _take_status(store, run_id, node, asked.results[node.host.name]) or waiting
        if not record.terminal:
            _mark_waiting_hosts(store, run_id)
            open_state = RunState.WAITING if waiting else RunState.RUNNING if asked.ok else RunState.UNREACHABLE
            conclude(store, run_id, open_state=open_state, verdict=outcome.reconciled)
    return store.get(run_id), asked.failed


def _take_status(store: RunStore, run_id: str, node: Node, answer: dict) -> bool:
    """A host's status answer into the record; True when the run still waits there for its turn."""
    if answer.get("waiting"):  # --detach --wait: its waiter holds the job until the hosts are free
        return True
    if not answer.get("started"):  # the controller died before starting this host (or it gave up waiting)
        if answer.get("gave_up"):
            store.update_run(run_id, reason=f"gave up waiting for its turn: {answer['gave_up']}")
        for rank in node.ranks:
            store.update_rank(run_id, rank, state=RankState.NOT_STARTED)
        return False
    ranks = answer["ranks"]
    record_exits(store, run_id, node, {r: i["exit"] for r, i in ranks.items() if i.get("exit")}, answer.get("now"))
    for rank, info in ranks.items():
        if not info.get("exit") and info.get("pid"):
            store.update_rank(run_id, int(rank), state=RankState.RUNNING)
    if answer.get("done"):
        store.update_host(run_id, node.index, state=HostState.DONE)
    return False


def _mark_waiting_hosts(store: RunStore, run_id: str) -> None:
    """The controller died while starting: hosts whose ranks run (waiting for peers that never come)
    still owe a stop."""
    record = store.get(run_id)
    if not any(r.state is RankState.NOT_STARTED for r in record.ranks):
        return
    running = {r.host for r in record.ranks if not r.state.terminal}
    for h in record.hosts:
        if h.name in running:
            store.update_host(run_id, h.node_rank, cleanup=Cleanup.PENDING)


def newest_open(store: RunStore, connect_of: Callable[[RunRecord], Connect]) -> Optional[RunRecord]:
    """The newest run that may still run (what `stop` without a RUN stops), each candidate brought up to
    date first (ps's reconcile): a record left "running" by a controller that died may have ended since."""
    for run_id in store.open_ids():
        record = store.get(run_id)
        record, _ = reconcile(store, run_id, connect_of(record))
        if record.still_open:
            return record
    return None
