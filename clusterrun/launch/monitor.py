"""A started run until its end: follow every host, stop all on the first failure, Ctrl-C or time limit,
then work out the result with the root cause first (torchrun's "first observed failure")."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Set, Union

from ..config.inventory import Timeouts
from ..errors import HostError
from ..events import HostRestarts, Notice, Phase, RankEnded, RankSeen, Rendezvous, Stuck, TICK, counted
from ..hosts.client import HostClient
from ..hosts.follow import FollowDone, Follower, HostLost, LogFiles, PeerLost, RankExit, RunGone
from ..hosts.group import fan_out_background
from ..hosts.logs import tail_lines
from ..hosts.wire import FollowStream
from ..outcome import EndedBy, RankResult, RunOutcome, decide, root_cause
from ..plan import LaunchPlan, known_addresses
from ..registry.store import RunStore
from ..states import Cleanup, HostState, RankState

TAIL_LINES = 12


@dataclass(frozen=True)
class _StopDone:
    node_rank: int
    error: Optional[str]


class Monitor:
    def __init__(self, plan: LaunchPlan, store: RunStore, *, client: Callable[[int], HostClient],
                 streams: Optional[Dict[int, FollowStream]] = None,
                 reconnect: Callable[[int], HostClient], emit: Callable[[object], None], events: "queue.Queue",
                 timeouts: Timeouts, t0: float, restarts_allowed: int = 0, inventory: str = "INVENTORY"):
        self.plan = plan
        self.store = store
        self._client = client
        self._streams = dict(streams or {})  # node rank -> its follow frames, already flowing (the push's channel)
        self._reconnect = reconnect
        self._emit = emit
        self._q = events
        self._timeouts = timeouts
        self._t0 = t0
        self._ended: Dict[int, RankResult] = {}  # rank → how it ended (controller clock)
        self._lost: Dict[int, str] = {}  # node_rank → why
        self._followed: Set[int] = set()
        self._stop_reason: Optional[EndedBy] = None
        self._stop_started: Optional[float] = None
        self._stopping: Dict[int, int] = {}  # node rank -> stop calls in flight
        self._forced = False
        self._interrupt: Optional[bool] = None  # None, or force?
        self._node_of = {r.rank: r.node_rank for r in plan.ranks}
        self._restarts_allowed = restarts_allowed
        self._inventory = inventory
        self._warned: Set[tuple] = set()

    def _index(self, node_rank: int) -> int:
        """The host's place in the inventory (the registry's key), from its place in this attempt."""
        return self.plan.nodes[node_rank].index

    def interrupt(self, force: bool) -> None:
        """From the signal handler: only records the wish; the loop acts on it."""
        self._interrupt = bool(force or self._interrupt)

    # -------------------------------------------------------------- the loop

    def run(self) -> RunOutcome:
        t_run = time.monotonic()
        followers = self._start_followers()
        self._emit(Phase("run", f"{counted(self.plan.world_size, 'rank')} on {counted(len(self.plan.nodes), 'host')}"))
        with self.store.batch():
            for r in self.plan.ranks:
                self.store.update_rank(self.plan.run_id, r.rank, state=RankState.RUNNING)
        nodes = {n.node_rank for n in self.plan.nodes}
        while True:
            self._handle_events()
            self._emit(TICK)
            self._act_on_signals()
            self._check_time_limit()
            if self._followed | set(self._lost) >= nodes and not self._stops_awaited():
                break
            if self._stop_overdue():
                for node_rank in nodes - self._followed - set(self._lost):
                    self._lost[node_rank] = "its ranks' exits never arrived after the stop"
                break
        for f in followers.values():
            f.stop()
        for f in followers.values():
            f.join(timeout=2.0)
        self._handle_events(block=False)
        return self._outcome(time.monotonic() - t_run)

    def _start_followers(self) -> Dict[int, Follower]:
        """A follower per host, by node rank, each copying its host's logs into the registry."""
        followers = {}
        run_id = self.plan.run_id
        attempt = self.plan.attempt
        self.store.log_folder(run_id, attempt)  # made once here, not once a rank (log_path) in this loop
        for node in self.plan.nodes:
            files = LogFiles(rank=lambda r: self.store.log_file(run_id, r, attempt),
                             aux=lambda name, host=node.host.name: self.store.aux_log_path(run_id, host, name,
                                                                                          attempt))
            f = Follower(node_rank=node.node_rank, host=node.host.name, ranks=[r.rank for r in node.ranks],
                         files=files, world_size=self.plan.world_size, attempt_key=self.plan.attempt_key,
                         client=self._client_for(node.node_rank), out=self._q, host_lost_s=self._timeouts.host_lost,
                         aux=("torchrun",) if node.torchrun else (), first=self._streams.pop(node.node_rank, None))
            followers[node.node_rank] = f
            f.start()
        return followers

    def _check_time_limit(self) -> None:
        limit = self.plan.time_limit_s
        if limit is not None and self._stop_reason is None and time.monotonic() - self._t0 > limit:
            self._begin_stop(EndedBy.TIME_LIMIT, self._timeouts.grace)
            self._emit(Notice(f"time limit of {limit:g} s reached: stopping every host", "warning"))

    def _stop_overdue(self) -> bool:
        """A stop began, its calls came back, and the time for the ranks' exits to arrive is over."""
        return self._stop_started is not None and not self._stops_awaited() and \
            time.monotonic() - self._stop_started > self._timeouts.grace + self._timeouts.host_lost + 5

    def _client_for(self, node_rank: int) -> Callable[[bool], HostClient]:
        return lambda reconnect: self._reconnect(node_rank) if reconnect else self._client(node_rank)

    def _handle_events(self, block: bool = True) -> None:
        """Handle every queued event; wait up to 50 ms for the first one."""
        try:
            ev = self._q.get(timeout=0.05) if block else self._q.get_nowait()
        except queue.Empty:
            return
        with self.store.batch():  # what many hosts said at once (128 exits, 128 ends) is one commit, not 256
            while True:
                self._handle(ev)
                try:
                    ev = self._q.get_nowait()
                except queue.Empty:
                    return

    def _handle(self, ev: object) -> None:
        handler = {RankSeen: self._on_seen, Stuck: self._on_stuck, Rendezvous: self._on_stuck, HostRestarts: self._on_restarts,
                   RankExit: self._on_exit, HostLost: self._on_lost, RunGone: self._on_lost, FollowDone: self._on_done,
                   PeerLost: self._on_peer_lost,
                   _StopDone: self._on_stop_done}.get(type(ev))
        if handler is None:
            self._emit(ev)  # log lines, notices: for the terminal
        else:
            handler(ev)

    def _on_seen(self, ev: RankSeen) -> None:
        """torchrun's rendezvous placed this rank on that host."""
        if self._node_of.get(ev.rank) != ev.node_rank:
            self._node_of[ev.rank] = ev.node_rank
            self.store.update_rank(self.plan.run_id, ev.rank, node_rank=ev.node_rank,
                                   host=self.plan.nodes[ev.node_rank].host.name)

    def _on_stuck(self, ev: Union[Stuck, Rendezvous]) -> None:
        """The rendezvous watchdogs' warnings, each once."""
        if ev.key not in self._warned:
            self._warned.add(ev.key)
            self._emit(Notice(ev.describe(self._inventory), "warning"))

    def _on_restarts(self, ev: HostRestarts) -> None:
        self.store.update_host(self.plan.run_id, self._index(ev.node_rank), restarts=ev.restarts)
        self._emit(Notice(f"{ev.host}: torchrun restarted its workers (restart {ev.restarts} of "
                          f"{self._restarts_allowed})", "warning"))

    def _on_lost(self, ev: HostLost) -> None:
        if ev.node_rank in self._lost or ev.node_rank in self._followed:
            return
        self._lost[ev.node_rank] = ev.reason
        self._emit(Notice(f"{ev.host}: host lost: {ev.reason}", "error"))
        now = time.time()
        for rank in sorted(r for r, n in self._node_of.items() if n == ev.node_rank):
            if rank not in self._ended:
                self._ended[rank] = RankResult.lost(rank, ev.node_rank, ev.host, ev.reason,
                                                    ended_at=now, log_path=self._log_path(rank))
                self.store.record_rank(self.plan.run_id, self._ended[rank])
        self.store.update_host(self.plan.run_id, self._index(ev.node_rank), state=HostState.LOST, cleanup=Cleanup.PENDING,
                               error=ev.reason)
        if self._stop_reason is None:
            self._begin_stop(EndedBy.FAILURE, self._timeouts.grace)

    def _on_peer_lost(self, ev: PeerLost) -> None:
        """Rank 0's host's supervisor lost a host (its supervisor's connection closed, or it went silent):
        the same verdict as that host's own follower would reach host_lost later, taken now, so the launch
        ends when the run has ended everywhere it can reach (one story: the supervisors' words)."""
        if 0 <= ev.node_rank < len(self.plan.nodes) and ev.node_rank != 0:
            self._on_lost(HostLost(ev.node_rank, self.plan.nodes[ev.node_rank].host.name, ev.reason))

    def _on_done(self, ev: FollowDone) -> None:
        self._followed.add(ev.node_rank)
        if ev.node_rank not in self._lost:
            self.store.update_host(self.plan.run_id, self._index(ev.node_rank), state=HostState.DONE)

    def _on_stop_done(self, ev: "_StopDone") -> None:
        self._stopping[ev.node_rank] -= 1
        if not self._stopping[ev.node_rank]:
            del self._stopping[ev.node_rank]
        if ev.error is None:
            self.store.update_host(self.plan.run_id, self._index(ev.node_rank), cleanup=Cleanup.DONE)
        else:
            self.store.update_host(self.plan.run_id, self._index(ev.node_rank), cleanup=Cleanup.PENDING, error=ev.error)
            self._emit(Notice(f"{self.plan.nodes[ev.node_rank].host.name}: could not stop: {ev.error}; "
                              f"`clusterrun stop {self.plan.run_id}` finishes it later", "error"))

    def _on_exit(self, ev: RankExit) -> None:
        if ev.rank in self._ended:
            return
        host = self.plan.nodes[ev.node_rank].host.name
        result = self._ended[ev.rank] = RankResult.from_exit(ev.rank, ev.node_rank, host, ev.info,
                                                             clock_offset=ev.clock_offset,
                                                             log_path=self._log_path(ev.rank))
        self.store.record_rank(self.plan.run_id, result)
        cause = root_cause(list(self._ended.values()))
        self._emit(RankEnded(host, ev.rank, result.describe(cause), result.state.failed))
        if result.state.failed and self._stop_reason is None:
            self._begin_stop(EndedBy.FAILURE, self._timeouts.grace)

    def _act_on_signals(self) -> None:
        force, self._interrupt = self._interrupt, None
        if force is None:
            return
        if self._stop_reason is not EndedBy.INTERRUPT:
            self._emit(Notice("interrupted: stopping every host (Ctrl-C again within 1 s kills at once)", "warning"))
        first = self._stop_reason is None
        self._stop_reason = EndedBy.INTERRUPT
        if first:
            self._start_stops(self._timeouts.grace if not force else 0.0)
        if force and not self._forced:
            self._forced = True
            self._emit(Notice("killing every rank now", "warning"))
            self._start_stops(0.0)

    # -------------------------------------------------------------- stopping

    def _begin_stop(self, reason: EndedBy, grace: float) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
            self._start_stops(grace)

    def _start_stops(self, grace: float) -> None:
        """Stop every host in parallel, without blocking the loop that shows the last logs."""
        self._stop_started = self._stop_started or time.monotonic()
        for node in self.plan.nodes:
            self._stopping[node.node_rank] = self._stopping.get(node.node_rank, 0) + 1
        fan_out_background(self.plan.nodes, lambda node: self._stop_node(node.node_rank, grace),
                           name=lambda node: node.host.name, thread_name="stop",
                           on_each=lambda node, result: self._q.put(_StopDone(
                               node.node_rank, result.message if isinstance(result, HostError) else None)))

    def _stops_awaited(self) -> bool:
        """Stops still to wait for: not those of lost hosts (they end by the connect timeout, in the
        background; the host stays `cleanup pending` unless one gets through before the run ends)."""
        return any(n not in self._lost for n in self._stopping)

    def _stop_node(self, node_rank: int, grace: float) -> None:
        # a lost host's old connection is dead: go straight to one fresh attempt (bounded by the connect timeout)
        why = (self._stop_reason or EndedBy.USER_STOP).value  # into the ranks' exit records
        if node_rank not in self._lost:
            try:
                self._client(node_rank).stop(self.plan.attempt_key, grace, why)
                return
            except HostError:
                pass
        self._reconnect(node_rank).stop(self.plan.attempt_key, grace, why)

    # -------------------------------------------------------------- result

    def _log_path(self, rank: int) -> str:
        return self.store.log_path(self.plan.run_id, rank, self.plan.attempt)

    def _result(self, rank: int) -> RankResult:
        if rank in self._ended:
            return self._ended[rank]
        node_rank = self._node_of[rank]
        return RankResult.lost(rank, node_rank, self.plan.nodes[node_rank].host.name,
                               self._lost.get(node_rank, "no exit status arrived"), log_path=self._log_path(rank))

    def _outcome(self, seconds: float) -> RunOutcome:
        results = []
        for r in self.plan.ranks:
            res = self._result(r.rank)
            if res.state.failed:
                res = replace(res, tail=tuple(tail_lines(res.log_path, TAIL_LINES)))
            results.append(res)
        result = decide(self.plan.run_id, results, ended_by=self._stop_reason, time_limit=self.plan.time_limit_s,
                        addresses=known_addresses(self.plan))
        if result is None:  # cannot be: every rank has an end here (an exit, or lost)
            raise RuntimeError(f"run {self.plan.run_id}: the monitor ended with ranks still open")
        pending = tuple(h.name for h in self.store.get(self.plan.run_id).hosts if h.cleanup is Cleanup.PENDING) or \
            tuple(self.plan.nodes[n].host.name for n in sorted(self._lost))
        self.store.conclude(result)
        return replace(result, cleanup_pending=pending, seconds=seconds)
