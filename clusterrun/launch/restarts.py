"""job.restarts with a controller: after a failed attempt, the next one on the hosts still there.

Every rank was stopped by the attempt's monitor (first-failure teardown). If attempts remain, the lost
hosts are dropped (while job.min_nodes remain), ranks are renumbered in node order over the survivors,
rank 0's host (and MASTER_ADDR) moves if it was dropped, MASTER_PORT is chosen afresh where the inventory
says `auto`, and attempt K starts in RUN/attempt-K on every host, sharing the run's job folder (and its
checkpoint folder). Ctrl-C and `clusterrun stop` never lead to a restart; the time limit counts the
whole run. Under launcher torchrun, torchrun restarts its own workers (job.restarts is its
--max-restarts); clusterrun makes a new attempt only after a host was lost (torchrun cannot: its
rendezvous and workers wait on the dead host until a collective times out).

Pure decisions only: the attempt loop that acts on them is the runner's (launch/runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Set, Tuple

from ..config.inventory import Inventory, Job
from ..outcome import AttemptSummary, RunOutcome
from ..plan import LaunchPlan, build_plan
from ..states import RankState


@dataclass(frozen=True)
class NextAttempt:
    attempt: int
    hosts: Tuple[int, ...]  # inventory indices of the hosts that take part
    dropped: Tuple[str, ...]  # "node2 dropped: host lost"


def summary(plan: LaunchPlan, outcome: RunOutcome, dropped: Tuple[str, ...] = ()) -> AttemptSummary:
    return AttemptSummary(plan.attempt, tuple(n.host.name for n in plan.nodes), plan.world_size, outcome.state,
                          outcome.reason, dropped)


def next_attempt(inv: Inventory, plan: LaunchPlan, outcome: RunOutcome,
                 elapsed: float = 0.0) -> Tuple[Optional[NextAttempt], str]:
    """The attempt to make after this one, or None and why not ("" when none was due).

    elapsed: seconds since the launch began (job.time_limit counts the whole run, every attempt)."""
    job = inv.job
    lost = {r.host for r in outcome.ranks if r.state is RankState.LOST}
    why = _why_not_due(job, plan, outcome, lost, elapsed)
    if why is not None:
        return None, why
    survivors = tuple(n.index for n in plan.nodes if n.host.name not in lost)
    dropped = tuple(f"{n.host.name} dropped: host lost" for n in plan.nodes if n.host.name in lost)
    needed = job.min_nodes or len(inv.hosts)
    if len(survivors) < needed:
        return None, (f"no restart: {len(survivors)} host{'s' if len(survivors) != 1 else ''} left, "
                      f"job.min_nodes is {needed}")
    return NextAttempt(plan.attempt + 1, survivors, dropped), ""


def _why_not_due(job: Job, plan: LaunchPlan, outcome: RunOutcome, lost: Set[str], elapsed: float) -> Optional[str]:
    """Why no attempt follows, whatever hosts are left ("" when none was due); None: one may."""
    if not outcome.failed:
        return ""  # success, Ctrl-C, clusterrun stop, the time limit: never a restart
    if job.launcher == "torchrun" and not lost and not outcome.hung:
        return ""  # torchrun restarted its workers itself (--max-restarts) and gave up (a hang it cannot see)
    if plan.attempt >= job.restarts:
        return (f"no restart left: {plan.attempt + 1} attempts made (job.restarts: {job.restarts})"
                if job.restarts else "")
    if job.time_limit_s is not None and elapsed + job.restart_delay_s >= job.time_limit_s:
        return f"no restart: the time limit of {job.time_limit_s:g} s counts the whole run and is (nearly) spent"
    return None


def attempt_plan(inv: Inventory, run_id: str, nxt: NextAttempt, free_port: Callable[[int], int],
                 network: Optional[Mapping[int, Mapping]] = None) -> LaunchPlan:
    """The plan over the survivors; MASTER_PORT afresh (a free one on the new rank 0's host) unless the
    inventory names one (firewalls open by port): a rank of the old attempt still running on a host cut off
    from the controller can then never join the new attempt's rendezvous. network: the interfaces the
    launch's push found (toward the first rank 0: on the same network, the new one's route is the same)."""
    port = inv.master_port if inv.master_port_fixed else free_port(nxt.hosts[0])
    return build_plan(inv, run_id, master_port=port, attempt=nxt.attempt, hosts=nxt.hosts, network=network)


def announcement(nxt: NextAttempt, inv: Inventory) -> str:
    """What the user is told before attempt K starts."""
    total = inv.job.restarts + 1
    dropped = f" ({'; '.join(nxt.dropped)})" if nxt.dropped else ""
    return (f"attempt {nxt.attempt + 1}/{total} on {len(nxt.hosts)} host{'s' if len(nxt.hosts) != 1 else ''}"
            f"{dropped} in {inv.job.restart_delay_s:g} s")
