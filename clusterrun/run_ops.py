"""`ps`, `logs` and `stop` on recorded runs: reach the hosts again from the run record, any time later,
also after the controller that started the run is gone."""

from __future__ import annotations

import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .errors import EXIT_FAILED, EXIT_OK, HostError
from .events import LogLines
from .follow import FollowDone, Follower, HostLost
from .host_agent import HostAgent
from .inventory import Host, Inventory, inventory_from_snapshot
from .monitor import classify
from .runner import controller_alive
from .store import RunRecord, RunStore

Connect = Callable[[Host], HostAgent]


@dataclass(frozen=True)
class Node:
    node_rank: int
    host: Host
    ranks: Tuple[int, ...]


def nodes_of(record: RunRecord) -> Tuple[Inventory, List[Node]]:
    inv = inventory_from_snapshot(record.snapshot)
    nodes = [Node(n["node_rank"], inv.hosts[n["node_rank"]], tuple(r["rank"] for r in n["ranks"]))
             for n in record.plan["nodes"]]
    return inv, nodes


def connect_all(nodes: Sequence[Node], connect: Connect) -> Tuple[Dict[int, HostAgent], Dict[str, HostError]]:
    """Connect in parallel; report failures by host name instead of raising."""
    agents: Dict[int, HostAgent] = {}
    failures: Dict[str, HostError] = {}
    if not nodes:
        return agents, failures
    with ThreadPoolExecutor(max_workers=min(64, len(nodes))) as pool:
        futures = {pool.submit(connect, n.host): n for n in nodes}
        for fut, node in futures.items():
            try:
                agents[node.node_rank] = fut.result()
            except HostError as exc:
                failures[node.host.name] = exc
    return agents, failures


def _fan(agents: Dict[int, HostAgent], fn: Callable[[int, HostAgent], object]) -> Dict[int, object]:
    """fn on every agent in parallel; an exception is kept as that host's result."""
    if not agents:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(agents))) as pool:
        futures = {n: pool.submit(fn, n, a) for n, a in agents.items()}
    out: Dict[int, object] = {}
    for n, fut in futures.items():
        try:
            out[n] = fut.result()
        except HostError as exc:
            out[n] = exc
    return out


def _record_exit(store: RunStore, run_id: str, rank: int, rec: dict, offset: float) -> None:
    ended = rec.get("ended_at")
    store.update_rank(run_id, rank, state=classify(rec), exit_code=rec.get("exit_code"), signal=rec.get("signal"),
                      started_at=(rec.get("started_at") - offset) if rec.get("started_at") else None,
                      ended_at=(ended - offset) if ended else None, note=rec.get("error"))


def settle(store: RunStore, run_id: str, default_state: str = "running") -> RunRecord:
    """Set the run's state from its ranks' states once every rank has one."""
    record = store.get(run_id)
    if record.terminal:
        return record
    states = [r["state"] for r in record.ranks]
    if any(s in ("pending", "running") for s in states):
        if default_state != record.state:
            store.update_run(run_id, state=default_state)
        return store.get(run_id)
    failed = sorted((r for r in record.ranks if r["state"] in ("failed", "lost")),
                    key=lambda r: (r["ended_at"] or float("inf"), r["rank"]))
    if failed:
        root = failed[0]
        what = f"exit code {root['exit_code']}" if root["exit_code"] is not None else \
            (f"signal {root['signal']}" if root["signal"] else root["note"] or root["state"])
        state, code, reason = "failed", EXIT_FAILED, f"rank {root['rank']} on {root['host']}: {what}"
    elif all(s == "succeeded" for s in states):
        state, code, reason = "succeeded", EXIT_OK, ""
    elif "not-started" in states:
        state, code, reason = "failed", EXIT_FAILED, record.reason or "the controller ended before every rank started"
    else:
        state, code, reason = "stopped", EXIT_FAILED, record.reason or "stopped"
    ended = max((r["ended_at"] or 0) for r in record.ranks) or time.time()
    store.update_run(run_id, state=state, exit_code=code, reason=reason, ended_at=ended)
    return store.get(run_id)


def reconcile(store: RunStore, run_id: str, connect: Connect) -> Tuple[RunRecord, Dict[str, HostError]]:
    """Bring a run whose controller is gone up to date by asking its hosts."""
    record = store.get(run_id)
    if (record.terminal and not record.cleanup_pending) or controller_alive(record.controller):
        return record, {}
    _, nodes = nodes_of(record)
    agents, failures = connect_all(nodes, connect)
    try:
        answers = _fan(agents, lambda n, a: a.status(run_id))
    finally:
        for a in agents.values():
            a.close()
    for node_rank, answer in answers.items():
        name = nodes[node_rank].host.name
        if isinstance(answer, HostError):
            failures[name] = answer
            continue
        offset = answer.get("now", time.time()) - time.time()
        if not answer.get("started"):  # the controller died before starting this host: it never will
            for rank in nodes[node_rank].ranks:
                store.update_rank(run_id, rank, state="not-started")
            continue
        for rank, info in answer["ranks"].items():
            if info.get("exit"):
                _record_exit(store, run_id, int(rank), info["exit"], offset)
            elif info.get("pid"):
                store.update_rank(run_id, int(rank), state="running")
        if answer.get("done"):
            store.update_host(run_id, node_rank, state="done")
    if not record.terminal:
        record = store.get(run_id)
        never = sorted({r["host"] for r in record.ranks if r["state"] == "not-started"})
        running = {r["node_rank"] for r in record.ranks if r["state"] in ("pending", "running")}
        if never and running:
            # the controller died while starting: what did start waits for peers that never come
            for node_rank in running:
                store.update_host(run_id, node_rank, cleanup="pending")
            store.update_run(run_id, state="failed", exit_code=EXIT_FAILED, ended_at=time.time(),
                             reason=f"the controller ended before {', '.join(never)} started; "
                                    f"`clusterrun stop {run_id}` ends the ranks that did start")
        else:
            settle(store, run_id, default_state="unreachable" if failures else "running")
    return store.get(run_id), failures


def stop_run(store: RunStore, run_id: str, connect: Connect, grace: float) -> Tuple[RunRecord, Dict[str, HostError]]:
    """Stop every rank by its recorded process group; idempotent; unreachable hosts stay pending."""
    record = store.get(run_id)
    _, nodes = nodes_of(record)
    targets = [n for n in nodes if not (record.terminal and
                                        record.hosts[n.node_rank].get("cleanup") in (None, "done")
                                        and record.hosts[n.node_rank].get("state") != "lost")]
    agents, failures = connect_all(targets, connect)
    try:
        answers = _fan(agents, lambda n, a: a.stop(run_id, grace))
    finally:
        for a in agents.values():
            a.close()
    for node in targets:
        answer = answers.get(node.node_rank)
        if isinstance(answer, HostError):
            failures[node.host.name] = answer
        if node.host.name in failures:
            store.update_host(run_id, node.node_rank, cleanup="pending", error=str(failures[node.host.name]))
            continue
        for rank, rec in (answer or {}).get("exits", {}).items():
            if store.get(run_id).ranks[int(rank)]["state"] in ("pending", "running"):
                _record_exit(store, run_id, int(rank), rec, 0.0)
        store.update_host(run_id, node.node_rank, cleanup="done", state="stopped")
    if not failures:
        store.update_run(run_id, reason=record.reason or "stopped by `clusterrun stop`")
    return settle(store, run_id, default_state="unknown" if failures else "stopped"), failures


def fetch_logs(store: RunStore, run_id: str, connect: Connect, *, follow: bool,
               on_lines: Callable[[LogLines], None], on_problem: Callable[[str], None],
               before_follow: Callable[[], None] = lambda: None, stop_flag: Optional[list] = None,
               host_lost_s: float = 15.0) -> None:
    """Bring the local log copies up to date from the hosts (by byte offset); with follow, keep going and
    hand every new line to on_lines until every rank has ended or stop_flag gets an element."""
    record = store.get(run_id)
    _, nodes = nodes_of(record)
    events: "queue.Queue" = queue.Queue()
    agents, failures = connect_all(nodes, connect)
    for name, err in failures.items():
        on_problem(f"{name}: {err.message}; showing the local copy of its logs")

    def start(once: bool) -> List[Follower]:
        followers = []
        for node in nodes:
            if node.node_rank not in agents:
                continue
            paths = {r: store.log_path(run_id, r) for r in node.ranks}
            offsets = {r: _size(p) for r, p in paths.items()}
            agent = agents[node.node_rank]
            f = Follower(node_rank=node.node_rank, host=node.host.name, ranks=paths, run_id=run_id,
                         agent=lambda reconnect, a=agent, h=node.host: connect(h) if reconnect else a,
                         out=events, host_lost_s=host_lost_s, offsets=offsets, once=once)
            f.start()
            followers.append(f)
        return followers

    def pump(followers: List[Follower], show: bool) -> None:
        live = {f.node_rank for f in followers}
        while live and not (stop_flag and stop_flag[0]):
            try:
                ev = events.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(ev, LogLines) and show:
                on_lines(ev)
            elif isinstance(ev, FollowDone):
                live.discard(ev.node_rank)
            elif isinstance(ev, HostLost):
                live.discard(ev.node_rank)
                on_problem(f"{ev.host}: {ev.reason}")
        for f in followers:
            f.stop()
        for f in followers:
            f.join(timeout=2.0)

    try:
        pump(start(once=True), show=False)  # catch up: the local copies now hold everything so far
        if follow:
            before_follow()
            pump(start(once=False), show=True)
    finally:
        for a in agents.values():
            a.close()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
