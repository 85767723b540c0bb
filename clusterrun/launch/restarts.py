"""job.restarts with a controller: after a failed attempt, the next one on the hosts still there.

Every rank was stopped by the attempt's monitor (first-failure teardown). If attempts remain, the lost
hosts are dropped (while job.min_nodes remain), ranks are renumbered in node order over the survivors,
rank 0's host (and MASTER_ADDR) moves if it was dropped, MASTER_PORT is chosen afresh where the inventory
says `auto`, and attempt K starts in RUN/attempt-K on every host, sharing the run's job folder (and its
checkpoint folder). Ctrl-C and `clusterrun stop` never lead to a restart; the time limit counts the
whole run. Under launcher torchrun, torchrun restarts its own workers (job.restarts is its
--max-restarts); clusterrun makes a new attempt only after a host was lost (torchrun cannot: its
rendezvous and workers wait on the dead host until a collective times out).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Tuple

from ..config.inventory import Inventory
from ..errors import HostsFailed
from ..events import Notice
from ..outcome import AttemptSummary, RankResult, RunOutcome
from ..plan import LaunchPlan, build_plan
from ..states import RankState, RunState


@dataclass(frozen=True)
class NextAttempt:
    attempt: int
    hosts: Tuple[int, ...]  # inventory indices of the hosts that take part
    dropped: Tuple[str, ...]  # "node2 dropped: host lost"


def summary(plan: LaunchPlan, outcome: RunOutcome, dropped: Tuple[str, ...] = ()) -> AttemptSummary:
    return AttemptSummary(plan.attempt, tuple(n.host.name for n in plan.nodes), plan.world_size, outcome.state,
                          outcome.reason, dropped)


def run_attempts(inv: Inventory, plan: LaunchPlan, outcome: RunOutcome, *,
                 start: Callable[[NextAttempt], Tuple[LaunchPlan, RunOutcome]], elapsed: Callable[[], float],
                 emit: Callable[[object], None], interrupted: Callable[[], bool],
                 archive: Callable[[Tuple[str, ...]], None], interrupt: Callable[[str], RunOutcome]) -> RunOutcome:
    """After the first attempt's outcome: while attempts remain after a failure, announce, wait the delay
    (Ctrl-C ends it all: `interrupt`), `start` the next one and follow it. The run's outcome is the last
    attempt's, with every attempt listed (none when there was only one)."""
    summaries: List[AttemptSummary] = []
    dropped: Tuple[str, ...] = ()
    while True:
        summaries.append(summary(plan, outcome, dropped))
        nxt, why = next_attempt(inv, plan, outcome, elapsed())
        if nxt is None:
            if why:
                emit(Notice(why, "error"))
            break
        archive(dropped)
        announce(nxt, inv, emit)
        if not wait_delay(inv.job.restart_delay_s, interrupted):
            outcome = interrupt(f"interrupted by the user (Ctrl-C) before attempt {nxt.attempt + 1} started")
            break
        dropped = nxt.dropped
        plan, outcome = start(nxt)
    return replace(outcome, attempts=tuple(summaries) if len(summaries) > 1 else ())


def next_attempt(inv: Inventory, plan: LaunchPlan, outcome: RunOutcome,
                 elapsed: float = 0.0) -> Tuple[Optional[NextAttempt], str]:
    """The attempt to make after this one, or None and why not ("" when none was due).

    elapsed: seconds since the launch began (job.time_limit counts the whole run, every attempt)."""
    job = inv.job
    if outcome.state is not RunState.FAILED:
        return None, ""  # success, Ctrl-C, clusterrun stop, the time limit: never a restart
    lost = {r.host for r in outcome.ranks if r.state is RankState.LOST}
    if job.launcher == "torchrun" and not lost:
        return None, ""  # torchrun restarted its workers itself (--max-restarts) and gave up
    if plan.attempt >= job.restarts:
        return None, (f"no restart left: {plan.attempt + 1} attempts made (job.restarts: {job.restarts})"
                      if job.restarts else "")
    if job.time_limit_s is not None and elapsed + job.restart_delay_s >= job.time_limit_s:
        return None, f"no restart: the time limit of {job.time_limit_s:g} s counts the whole run and is (nearly) spent"
    survivors = tuple(n.index for n in plan.nodes if n.host.name not in lost)
    dropped = tuple(f"{n.host.name} dropped: host lost" for n in plan.nodes if n.host.name in lost)
    needed = job.min_nodes or len(inv.hosts)
    if len(survivors) < needed:
        return None, (f"no restart: {len(survivors)} host{'s' if len(survivors) != 1 else ''} left, "
                      f"job.min_nodes is {needed}")
    return NextAttempt(plan.attempt + 1, survivors, dropped), ""


def attempt_plan(inv: Inventory, run_id: str, nxt: NextAttempt, free_port: Callable[[int], int]) -> LaunchPlan:
    """The plan over the survivors; MASTER_PORT afresh (a free one on the new rank 0's host) unless the
    inventory names one (firewalls open by port): a rank of the old attempt still running on a host cut off
    from the controller can then never join the new attempt's rendezvous."""
    port = inv.master_port if inv.master_port_fixed else free_port(nxt.hosts[0])
    return build_plan(inv, run_id, master_port=port, attempt=nxt.attempt, hosts=nxt.hosts)


def failed_start(plan: LaunchPlan, exc: HostsFailed, outcome: RunOutcome) -> RunOutcome:
    """An attempt that could not start on some hosts: those hosts count as lost (the next attempt goes on
    without them), the ranks elsewhere as stopped."""
    failed = set(exc.failures)
    ranks = tuple(RankResult(r.rank, r.node_rank, r.host_name,
                             RankState.LOST if r.host_name in failed else RankState.STOPPED,
                             note=f"could not start: {exc.failures[r.host_name].message}" if r.host_name in failed
                             else "its attempt did not start everywhere")
                  for r in plan.ranks)
    return replace(outcome, ranks=ranks)


def announce(nxt: NextAttempt, inv: Inventory, emit: Callable[[object], None]) -> None:
    total = inv.job.restarts + 1
    dropped = f" ({'; '.join(nxt.dropped)})" if nxt.dropped else ""
    emit(Notice(f"attempt {nxt.attempt + 1}/{total} on {len(nxt.hosts)} host{'s' if len(nxt.hosts) != 1 else ''}"
                f"{dropped} in {inv.job.restart_delay_s:g} s", "warning"))


def wait_delay(seconds: float, interrupted: Callable[[], bool]) -> bool:
    """Sleep the restart delay; False as soon as the user interrupts (no restart then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if interrupted():
            return False
        time.sleep(0.05)
    return not interrupted()
