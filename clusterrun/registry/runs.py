"""`ps`, `logs` and `stop` on recorded runs: reach the hosts again from the run record, any time later,
also after the controller that started the run is gone."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

from ..config.inventory import Host, Inventory, inventory_from_snapshot
from ..errors import HostError
from ..events import LogLines, RankSeen, Stuck
from ..hosts.client import HostClient
from ..hosts.follow import FollowDone, Follower, HostLost, LogFiles
from ..hosts.group import GroupResult, fan_out
from ..outcome import decide
from ..plan import attempt_key
from ..states import Cleanup, HostState, RankState, RunState
from .store import RunRecord, RunStore, controller_alive

Connect = Callable[[Host], HostClient]


@dataclass(frozen=True)
class Node:
    node_rank: int  # the host's place in the (current) attempt
    host: Host
    ranks: Tuple[int, ...]
    index: int  # its place in the inventory: the registry's key for hosts


def nodes_of(record: RunRecord, plan: Optional[dict] = None) -> Tuple[Inventory, List[Node]]:
    """The inventory recorded with the run, and the hosts of its current attempt (or of `plan`'s)."""
    inv = inventory_from_snapshot(record.snapshot)
    nodes = []
    for n in (plan or record.plan)["nodes"]:
        index = n.get("index", n["node_rank"])
        if index < 0:
            index = n["node_rank"]
        nodes.append(Node(n["node_rank"], inv.hosts[index], tuple(r["rank"] for r in n["ranks"]), index))
    return inv, nodes


def on_hosts(nodes: Sequence[Node], connect: Connect, fn: Callable[[HostClient], object]) -> GroupResult[int]:
    """Connect to every node and run fn there, all in parallel; results and errors by node rank."""
    def one(node: Node) -> object:
        client = connect(node.host)
        try:
            return fn(client)
        finally:
            client.close()

    return fan_out(nodes, one, key=lambda n: n.index, name=lambda n: n.host.name)


def conclude(store: RunStore, run_id: str, open_state: RunState = RunState.RUNNING) -> RunRecord:
    """Once every rank has an end, give the run its end (outcome.decide); until then, `open_state`."""
    record = store.get(run_id)
    if record.terminal:
        return record
    verdict = decide(record.ranks, stopped_reason=record.reason or "")
    if verdict is None:
        if open_state is not record.state:
            store.update_run(run_id, state=open_state)
        return store.get(run_id)
    ended = max((r.ended_at or 0) for r in record.ranks) or time.time()
    store.update_run(run_id, state=verdict.state, exit_code=verdict.exit_code, reason=verdict.reason, ended_at=ended)
    return store.get(run_id)


def reconcile(store: RunStore, run_id: str, connect: Connect) -> Tuple[RunRecord, Dict[str, HostError]]:
    """Bring a run whose controller is gone up to date by asking its hosts."""
    record = store.get(run_id)
    if (record.terminal and not record.cleanup_pending) or controller_alive(record.controller):
        return record, {}
    _, nodes = nodes_of(record)
    key = attempt_key(run_id, record.attempt)
    by_index = {n.index: n for n in nodes}
    asked = on_hosts(nodes, connect, lambda client: client.status(key))
    for index, answer in asked.results.items():
        offset = answer.get("now", time.time()) - time.time()
        if not answer.get("started"):  # the controller died before starting this host: it never will
            for rank in by_index[index].ranks:
                store.update_rank(run_id, rank, state=RankState.NOT_STARTED)
            continue
        for rank, info in answer["ranks"].items():
            if info.get("exit"):
                store.record_exit(run_id, int(rank), info["exit"], offset)
            elif info.get("pid"):
                store.update_rank(run_id, int(rank), state=RankState.RUNNING)
        if answer.get("done"):
            store.update_host(run_id, index, state=HostState.DONE)
    if not record.terminal:
        _conclude_reconciled(store, run_id, unreachable=not asked.ok)
    return store.get(run_id), asked.failed


def _conclude_reconciled(store: RunStore, run_id: str, unreachable: bool) -> None:
    record = store.get(run_id)
    never = sorted({r.host for r in record.ranks if r.state is RankState.NOT_STARTED})
    running = {r.host for r in record.ranks if not r.state.terminal}
    if never and running:
        # the controller died while starting: what did start waits for peers that never come
        for h in record.hosts:
            if h.name in running:
                store.update_host(run_id, h.node_rank, cleanup=Cleanup.PENDING)
        store.update_run(run_id, state=RunState.FAILED, exit_code=RunState.FAILED.exit_code, ended_at=time.time(),
                         reason=f"the controller ended before {', '.join(never)} started; "
                                f"`clusterrun stop {run_id}` ends the ranks that did start")
    else:
        conclude(store, run_id, open_state=RunState.UNREACHABLE if unreachable else RunState.RUNNING)


def stop_run(store: RunStore, run_id: str, connect: Connect, grace: float) -> Tuple[RunRecord, Dict[str, HostError]]:
    """Stop every rank by its recorded process group; idempotent; unreachable hosts stay pending."""
    record = store.get(run_id)
    inv, nodes = nodes_of(record)
    settled = {h.node_rank for h in record.hosts if h.cleanup in (None, Cleanup.DONE) and h.state is not HostState.LOST}
    targets = [n for n in nodes if not (record.terminal and n.index in settled)]
    current = {n.index for n in nodes}
    # hosts an earlier attempt left behind (lost, then dropped) that still owe a stop
    targets += [Node(-1, inv.hosts[h.node_rank], (), h.node_rank) for h in record.hosts
                if h.node_rank not in current and h.cleanup is Cleanup.PENDING]
    stopped = on_hosts(targets, connect, lambda client: client.stop(run_id, grace))  # every attempt there
    for index, error in stopped.errors.items():
        store.update_host(run_id, index, cleanup=Cleanup.PENDING, error=str(error))
    for index, answer in stopped.results.items():
        still_open = {r.rank for r in store.get(run_id).ranks if not r.state.terminal}
        for rank, rec in answer.get("exits", {}).items():
            if int(rank) in still_open and index in current:
                store.record_exit(run_id, int(rank), rec, 0.0)
        store.update_host(run_id, index, cleanup=Cleanup.DONE, state=HostState.STOPPED)
    if stopped.ok:
        store.update_run(run_id, reason=record.reason or "stopped by `clusterrun stop`")
    return conclude(store, run_id, open_state=RunState.STOPPED if stopped.ok else RunState.UNKNOWN), stopped.failed


def fetch_logs(store: RunStore, run_id: str, connect: Connect, *, follow: bool,
               on_lines: Callable[[LogLines], None], on_problem: Callable[[str], None],
               before_follow: Callable[[], None] = lambda: None, stop_flag: Optional[list] = None,
               host_lost_s: float = 15.0, attempt: Optional[int] = None) -> None:
    """Bring the local log copies up to date from the hosts (by byte offset); with follow, keep going and
    hand every new line to on_lines until every rank has ended or stop_flag gets an element. attempt: which
    attempt's logs (job.restarts; the current one when None)."""
    fetch = _LogFetch(store, run_id, connect, host_lost_s, attempt)
    for name, err in fetch.connected.failed.items():
        on_problem(f"{name}: {err.message}; showing the local copy of its logs")
    try:
        fetch.pump(fetch.start(once=True), None, on_problem, stop_flag)  # catch up: the copies hold all so far
        if follow:
            before_follow()
            fetch.pump(fetch.start(once=False), on_lines, on_problem, stop_flag)
    finally:
        for c in fetch.clients.values():
            c.close()


class _LogFetch:
    """`logs`: a follower per reachable host of a recorded run, writing the local copies."""

    def __init__(self, store: RunStore, run_id: str, connect: Connect, host_lost_s: float,
                 attempt: Optional[int] = None):
        self.store, self.run_id, self.connect, self.host_lost_s = store, run_id, connect, host_lost_s
        self.record = store.get(run_id)
        self.attempt = self.record.attempt if attempt is None else attempt
        self.current = self.attempt == self.record.attempt
        past = None if self.current else next(a for a in self.record.attempts if a.attempt == self.attempt)
        _, self.nodes = nodes_of(self.record, None if past is None else past.plan)
        self.ranks = self.record.ranks if past is None else past.ranks
        self.events: "queue.Queue" = queue.Queue()
        self.connected = fan_out(self.nodes, lambda n: connect(n.host), key=lambda n: n.node_rank,
                                 name=lambda n: n.host.name)
        self.clients: Dict[int, HostClient] = self.connected.results  # type: ignore[assignment]
        self.aux = ("torchrun",) if self.record.plan.get("launcher") == "torchrun" else ()
        self.warned: set = set()

    def start(self, once: bool) -> List[Follower]:
        followers = []
        for node in self.nodes:
            if node.node_rank in self.clients:
                followers.append(self._follower(node, once))
                followers[-1].start()
        return followers

    def _follower(self, node: Node, once: bool) -> Follower:
        store, run_id, attempt = self.store, self.run_id, self.attempt
        files = LogFiles(rank=lambda r: store.log_path(run_id, r, attempt),
                         aux=lambda name, host=node.host.name: store.aux_log_path(run_id, host, name, attempt))
        ranks = [r.rank for r in self.ranks if r.node_rank == node.node_rank]
        offsets: Dict[Hashable, int] = {r: _size(files.rank(r)) for r in ranks}
        offsets.update({("a", i): _size(files.aux(name)) for i, name in enumerate(self.aux)})
        client = self.clients[node.node_rank]
        return Follower(node_rank=node.node_rank, host=node.host.name, ranks=ranks, files=files,
                        world_size=len(self.ranks), run_id=attempt_key(run_id, attempt),
                        client=lambda reconnect, c=client, h=node.host: self.connect(h) if reconnect else c,
                        out=self.events, host_lost_s=self.host_lost_s, offsets=offsets, once=once, aux=self.aux)

    def pump(self, followers: List[Follower], on_lines: Optional[Callable[[LogLines], None]],
             on_problem: Callable[[str], None], stop_flag: Optional[list]) -> None:
        live = {f.node_rank for f in followers}
        while live and not (stop_flag and stop_flag[0]):
            try:
                ev = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(ev, LogLines) and on_lines is not None:
                on_lines(ev)
            elif isinstance(ev, RankSeen) and self.current and self.ranks[ev.rank].node_rank != ev.node_rank:
                self.store.update_rank(self.run_id, ev.rank, node_rank=ev.node_rank,
                                       host=self.nodes[ev.node_rank].host.name)
            elif isinstance(ev, Stuck) and (ev.node_rank, ev.rank, ev.remote) not in self.warned:
                self.warned.add((ev.node_rank, ev.rank, ev.remote))
                on_problem(ev.describe(self.record.inventory))
            elif isinstance(ev, (FollowDone, HostLost)):
                live.discard(ev.node_rank)
                if isinstance(ev, HostLost):
                    on_problem(f"{ev.host}: {ev.reason}")
        for f in followers:
            f.stop()
        for f in followers:
            f.join(timeout=2.0)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
