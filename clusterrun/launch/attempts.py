"""The runner's attempts (job.restarts): follow an attempt with its own monitor, and while attempts remain
after a failure, start the next one on the hosts still there (decisions: launch/restarts.py).

A mixin of Runner (launch/runner.py): it uses the runner's store, clients, queue and start machinery.
"""

from __future__ import annotations

import queue
import time
from typing import Tuple

from ..errors import HostsFailed
from ..events import Notice, Phase
from ..outcome import RunOutcome
from ..plan import LaunchPlan, plan_to_dict
from ..states import HostState, RunState
from . import restarts
from .monitor import Monitor


class Attempts:
    def _follow(self, plan: LaunchPlan) -> RunOutcome:
        """Watch one attempt to its end (launch/monitor.py), on a queue of its own: what the last attempt's
        threads still post (a lost host's stop ending late) never reaches the next one."""
        if plan.attempt:
            self._q = queue.Queue(maxsize=64)
        self.monitor = Monitor(plan, self.store, client=lambda node_rank: self._client(plan.nodes[node_rank].index),
                               reconnect=lambda node_rank: self._reconnect(plan.nodes[node_rank].index),
                               emit=self._emit, events=self._q, timeouts=self.inv.timeouts, t0=self._t0,
                               restarts_allowed=self.inv.job.restarts, inventory=self.inv.path)
        if self._interrupts:
            self.monitor.interrupt(force=self.force_requested)
        return self.monitor.run()

    def _attempts(self, plan: LaunchPlan, outcome: RunOutcome) -> RunOutcome:
        """job.restarts: while attempts remain after a failure, the next one (launch/restarts.py)."""
        return restarts.run_attempts(
            self.inv, plan, outcome, start=self._next, elapsed=self._elapsed, emit=self._emit,
            interrupted=lambda: bool(self._interrupts),
            archive=self._archive,
            interrupt=lambda why: self._finish(RunState.INTERRUPTED, RunState.INTERRUPTED.exit_code, why))

    def _archive(self, dropped: Tuple[str, ...]) -> None:
        """The attempt that ended goes to the history; the run is running again (`clean` leaves it be)."""
        self.store.archive_attempt(self.run_id, list(dropped))
        self.store.update_run(self.run_id, state=RunState.RUNNING, exit_code=None, ended_at=None)

    def _next(self, nxt: restarts.NextAttempt) -> Tuple[LaunchPlan, RunOutcome]:
        """Start attempt K over the hosts still there (rank 0's host first) and follow it; a host that
        cannot be started makes this attempt a failure with that host lost."""
        t = time.monotonic()
        self._emit(Phase("start", f"attempt {nxt.attempt + 1}"))
        plan = self._plan = restarts.attempt_plan(self.inv, self.run_id, nxt, lambda i: self._client(i).free_port())
        self.store.begin_attempt(self.run_id, plan.attempt, plan_to_dict(plan),
                                 [{"rank": r.rank, "node_rank": r.node_rank, "host": r.host_name} for r in plan.ranks])
        for node in plan.nodes:
            self.store.update_host(self.run_id, node.index, state=HostState.PENDING, error=None)
        self._emit(Notice(f"MASTER_ADDR={plan.master_addr} MASTER_PORT={plan.master_port} "
                          f"(world size {plan.world_size})"))
        with self._lock:
            self._started = []
        self._coordinator_port = None  # the new rank 0's host coordinates this attempt's supervisors
        try:
            self._start_all(plan)
        except HostsFailed as exc:
            self._emit(Notice(str(exc), "error"))
            self._undo(plan, grace=0.0)
            return plan, restarts.failed_start(plan, exc, self._finish(RunState.FAILED, exc.exit_code, str(exc)))
        self._phases.append((f"restart {plan.attempt}", time.monotonic() - t))
        self.store.update_run(self.run_id, state=RunState.RUNNING)
        return plan, self._follow(plan)
