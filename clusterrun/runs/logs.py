"""`logs` on a recorded run: the local copies brought up to date from the hosts by byte offset, followed
while the run lives (also after the controller that started it is gone), replayed from here when the hosts
keep nothing of it; the closing summary an attached launch prints, from the record."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from .. import outcome
from ..errors import UsageError
from ..events import LogLines, RankSeen, Rendezvous, Stuck
from ..hosts.client import HostClient
from ..hosts.follow import FollowDone, Follower, HostLost, LogFiles, RunGone
from ..hosts.group import fan_out, on_hosts
from ..hosts.logs import LineSplitter, tail_lines
from ..outcome import RankResult, RunOutcome
from ..plan import attempt_key
from ..registry.store import RunRecord, RunStore, controller_alive
from ..states import RankState
from .nodes import Connect, Node, nodes_of
from .reconcile import reconcile

TAIL_LINES = 12  # of a failed rank, under the root cause (as an attached launch shows)


def await_end(store: RunStore, run_id: str, connect: Connect, attempt: int,
              stop_flag: Sequence[bool] = ()) -> RunRecord:
    """The record once the followed attempt is over: its end, as the controller writes it while it lives
    (or the next attempt it begins), else as the hosts say (ps's reconcile). stop_flag: give up waiting."""
    while True:
        record = store.get(run_id)
        if record.terminal or record.attempt != attempt or stop_flag:
            return record
        if not controller_alive(record.controller):
            return reconcile(store, run_id, connect)[0]
        time.sleep(0.2)


def await_turn(store: RunStore, run_id: str, connect: Connect, on_standing: Callable[[Dict[str, dict]], None],
               stop_flag: Sequence[bool] = (), every: float = 2.0) -> RunRecord:
    """A `--detach --wait` run still in line: ask its hosts how it stands every `every` seconds, hand
    on_standing each host's standing whenever one changed ({host: {"position", "holders", "ahead"}}), and
    return the record once no host says it waits any more (started, or given up: ps's reconcile)."""
    record = store.get(run_id)
    _, nodes = nodes_of(record)
    key = attempt_key(run_id, record.attempt)
    last: Optional[Dict[str, dict]] = None
    while not stop_flag:
        asked = on_hosts(nodes, connect, lambda node, client: client.status(key), thread_name="status")
        waiting = {name: a.get("standing") or {} for name, a in asked.results.items() if a.get("waiting")}
        if not waiting and not asked.failed:
            break
        if waiting and waiting != last:
            on_standing(waiting)
            last = waiting
        deadline = time.monotonic() + every
        while time.monotonic() < deadline and not stop_flag:
            time.sleep(0.1)
    return reconcile(store, run_id, connect)[0]


def recorded_outcome(record: RunRecord) -> RunOutcome:
    """How a recorded run ended, for the closing summary an attached launch prints (outcome.py's)."""
    ranks = tuple(replace(r, tail=tuple(tail_lines(r.log_path, TAIL_LINES))) if r.state.failed and r.log_path
                  else r for r in record.ranks)
    attempts = [outcome.AttemptSummary(a.attempt, a.hosts, a.world_size, a.state, a.reason, a.dropped)
                for a in record.attempts]
    attempts.append(outcome.AttemptSummary(record.attempt, tuple(n["name"] for n in record.plan.get("nodes", ())),
                                           int(record.plan.get("world_size") or len(ranks)), record.state,
                                           record.reason or ""))
    seconds = (record.ended_at or time.time()) - record.created_at
    return outcome.recorded(record.id, record.state, record.exit_code, record.reason or "", ranks,
                            cleanup_pending=record.cleanup_pending, seconds=seconds, attempts=attempts)



@dataclass(frozen=True)
class LogSelection:
    """What `logs` shows of a run: one attempt's ranks, where each ran, and whether it can be followed."""

    run_id: str
    attempt: int  # 0-based
    attempts: int  # how many the run has had
    host_of: Mapping[int, str]  # rank -> host, in that attempt
    ranks: Tuple[int, ...]  # the ranks asked for (all by default)
    followable: bool  # the run's current attempt (an earlier one has ended)


def select_logs(record: RunRecord, attempt_no: Optional[int] = None, ranks: Sequence[int] = ()) -> LogSelection:
    """attempt_no: 1-based (default the last); ranks: only these (default all); UsageError if unknown."""
    attempt = record.attempt if attempt_no is None else attempt_no - 1
    if not 0 <= attempt <= record.attempt:
        raise UsageError(f"run {record.id} has attempt{'s 1-' if record.attempt else ' '}{record.attempt + 1} only "
                         f"(--attempt {attempt_no})")
    past = [a for a in record.attempts if a.attempt == attempt]
    host_of = {r.rank: r.host for r in (past[0].ranks if past else record.ranks)}
    wanted = tuple(sorted(set(ranks) if ranks else set(host_of)))
    unknown = set(wanted) - set(host_of)
    if unknown:
        raise UsageError(f"run {record.id} has no rank {', '.join(map(str, sorted(unknown)))} "
                         f"(it has ranks 0-{len(host_of) - 1})")
    return LogSelection(record.id, attempt, record.attempt + 1, host_of, wanted, followable=not past)


def replay_copies(store: RunStore, record: RunRecord, sel: LogSelection, *, tail: Optional[int] = None,
                  aux: bool = True) -> Iterator[LogLines]:
    """The local log copies of the selection, in order: each host's other output first (its setup,
    torchrun's own messages) when aux, then every rank's; with tail, the last N lines of each."""
    for path, host, rank, stream in log_copies(store, record, sel, aux):
        yield from _replay(path, host, rank, stream, tail)


Copy = Tuple[str, str, int, str]  # (path, host, rank, stream): a local log copy; rank -1 for a host's other output


def replay_interleaved(copies: Sequence[Copy], tail: Optional[int] = None) -> Iterator[Tuple[int, LogLines]]:
    """The lines of these copies one at a time, side by side: each copy's first line, then each one's
    second, and so on, with that number (`logs --fold`: the files keep no times, so lines are folded by
    how far into its log each came)."""
    lines = [_lines_of(path, tail) for path, _, _, _ in copies]
    sources = [(host, rank, stream) for _, host, rank, stream in copies]
    live = list(range(len(lines)))
    step = 0
    while live:
        for i in list(live):
            line = next(lines[i], None)
            if line is None:
                live.remove(i)
                continue
            host, rank, stream = sources[i]
            yield step, LogLines(host, -1, rank, line, stream)
        step += 1


def log_copies(store: RunStore, record: RunRecord, sel: LogSelection, aux: bool) -> List[Copy]:
    """Each local copy of the selection, in replay_copies' order (aux: the hosts' other output too)."""
    out = []
    if aux:
        for h in record.hosts:
            if sel.attempt == 0:
                out.append((store.aux_log_path(sel.run_id, h.name, "setup"), h.name, -1, "setup"))
            out.append((store.aux_log_path(sel.run_id, h.name, "torchrun", sel.attempt), h.name, -1, "torchrun"))
    return out + [(store.log_path(sel.run_id, rank, sel.attempt), sel.host_of[rank], rank, "") for rank in sel.ranks]


def _lines_of(path: str, tail: Optional[int]) -> Iterator[bytes]:
    """A copy's lines (each ending in a newline), read as they are needed; nothing when it is absent."""
    if not os.path.exists(path):
        return
    if tail is not None:
        yield from (line.encode() + b"\n" for line in tail_lines(path, tail))
        return
    with open(path, "rb") as fh:
        for line in fh:
            yield line if line.endswith(b"\n") else line + b"\n"


def _replay(path: str, host: str, rank: int, stream: str, tail: Optional[int]) -> Iterator[LogLines]:
    if not os.path.exists(path):
        return
    if tail is not None:
        data = "".join(line + "\n" for line in tail_lines(path, tail)).encode()
        if data:
            yield LogLines(host, -1, rank, data, stream)
        return
    splitter = LineSplitter()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            lines = splitter.feed(chunk)
            if lines:
                yield LogLines(host, -1, rank, lines, stream)
    rest = splitter.flush()
    if rest:
        yield LogLines(host, -1, rank, rest, stream)

def fetch_logs(store: RunStore, run_id: str, connect: Connect, *, follow: bool,
               on_lines: Callable[[LogLines], None], on_problem: Callable[[str], None],
               before_follow: Callable[[], None] = lambda: None, stop_flag: Optional[list] = None,
               host_lost_s: float = 15.0, attempt: Optional[int] = None,
               on_idle: Callable[[], None] = lambda: None) -> None:
    """Bring the local log copies up to date from the hosts (by byte offset); with follow, keep going and
    hand every new line to on_lines until every rank has ended or stop_flag gets an element. attempt: which
    attempt's logs (job.restarts; the current one when None); on_idle: called at least every 50 ms while
    following (a folding printer shows what it held)."""
    fetch = _LogFetch(store, run_id, connect, host_lost_s, attempt)
    for name, err in fetch.connected.failed.items():
        on_problem(f"{name}: {err.message}; showing the local copy of its logs")
    try:
        fetch.pump(fetch.start(once=True), None, on_problem, stop_flag)  # catch up: the copies hold all so far
        if fetch.gone:
            on_problem(_gone_note(run_id, {n.host.name: fetch.gone[n.host.name] for n in fetch.nodes
                                           if n.host.name in fetch.gone}))
        if follow:
            before_follow()
            fetch.pump(fetch.start(once=False), on_lines, on_problem, stop_flag, on_idle)
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
        # bounded, as a launch's: a slow reader holds the followers (and the SSH window) back, not memory
        self.events: "queue.Queue" = queue.Queue(maxsize=64)
        self.gone = _known_gone(store, self.record, self.ranks, [n.host.name for n in self.nodes])
        self.connected = fan_out([n for n in self.nodes if n.host.name not in self.gone], lambda n: connect(n.host),
                                 name=lambda n: n.host.name, thread_name="logs")
        self.clients: Dict[str, HostClient] = self.connected.results
        self.aux = ("torchrun",) if self.record.plan.get("launcher") == "torchrun" else ()
        self.warned: set = set()

    def start(self, once: bool) -> List[Follower]:
        followers = []
        for node in self.nodes:
            if node.host.name in self.clients and node.host.name not in self.gone:
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
        client = self.clients[node.host.name]
        return Follower(node_rank=node.node_rank, host=node.host.name, ranks=ranks, files=files,
                        world_size=len(self.ranks), attempt_key=attempt_key(run_id, attempt),
                        client=lambda reconnect, c=client, h=node.host: self.connect(h) if reconnect else c,
                        out=self.events, host_lost_s=self.host_lost_s, offsets=offsets, once=once, aux=self.aux)

    def pump(self, followers: List[Follower], on_lines: Optional[Callable[[LogLines], None]],
             on_problem: Callable[[str], None], stop_flag: Optional[list],
             on_idle: Callable[[], None] = lambda: None) -> None:
        live = {f.node_rank for f in followers}
        while live and not (stop_flag and stop_flag[0]):
            try:
                ev = self.events.get(timeout=0.05)
            except queue.Empty:
                on_idle()
                continue
            self._handle(ev, live, on_lines, on_problem)
            on_idle()
        for f in followers:
            f.stop()
        for f in followers:
            f.join(timeout=2.0)

    def _handle(self, ev: object, live: Set[int], on_lines: Optional[Callable[[LogLines], None]],
                on_problem: Callable[[str], None]) -> None:
        """One follower event; a host whose follower ended leaves live."""
        if isinstance(ev, LogLines) and on_lines is not None:
            on_lines(ev)
        elif isinstance(ev, RankSeen) and self.current and self.ranks[ev.rank].node_rank != ev.node_rank:
            self.store.update_rank(self.run_id, ev.rank, node_rank=ev.node_rank,
                                   host=self.nodes[ev.node_rank].host.name)
        elif isinstance(ev, (Stuck, Rendezvous)) and ev.key not in self.warned:
            self.warned.add(ev.key)
            on_problem(ev.describe(self.record.inventory))
        elif isinstance(ev, (FollowDone, HostLost)):
            live.discard(ev.node_rank)
            if isinstance(ev, RunGone):  # said once for every such host (fetch_logs)
                self.gone[ev.host] = ev.reason
            elif isinstance(ev, HostLost):
                on_problem(f"{ev.host}: {ev.reason}")


NEVER_STARTED = "no rank of it ever started"


def _known_gone(store: RunStore, record: RunRecord, ranks: Sequence[RankResult],
                hosts: Sequence[str]) -> Dict[str, str]:
    """Hosts the registry knows keep nothing of the run (not asked): those `clean` removed it from, and all
    of them when no rank ever started (a launch that failed before its start)."""
    if ranks and all(r.state is RankState.NOT_STARTED for r in ranks):
        return dict.fromkeys(hosts, NEVER_STARTED)
    cleaned = store.cleaned.hosts(record.id)
    return {h: "removed by `clean` on " + time.strftime("%m-%d %H:%M", time.localtime(cleaned[h]))
            for h in hosts if h in cleaned}


def _gone_note(run_id: str, gone: Mapping[str, str]) -> str:
    """One line for every host that keeps nothing of the run, grouped by why."""
    if set(gone.values()) == {NEVER_STARTED}:
        return f"run {run_id} never started a rank (see `clusterrun ps`): it has no logs"
    by_reason: Dict[str, List[str]] = {}
    for host, why in gone.items():
        by_reason.setdefault(why, []).append(host)
    whys = "; ".join(f"{', '.join(hosts)}: {why}" for why, hosts in by_reason.items())
    return f"the hosts no longer keep run {run_id} ({whys}); showing the local copy of its logs"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
