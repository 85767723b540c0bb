"""In which order a run's hosts start (job.start): every host at once (the default, fastest), or host
after host in rank order, each once the one before it has started all its ranks and job.start.gap has
passed (the by-hand way: `python train.py` typed on each machine in rank order). Scripts that take their
rank from a counter on a shared folder depend on it.

A host's own ranks, in rank order, are its supervisor's to start one after another, the gap apart
(remote/host/run/python_launcher.py; torchrun starts its workers itself). The steps are pure
(`start_steps`, `order_lines` for --dry-run); `start_all` walks them for the runner. The time limit is the
run's, not a host's: a host started later gets what is left of it (launch/spec.py: time_left)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple

from ..events import Starting
from ..plan import LaunchPlan, NodePlan


@dataclass(frozen=True)
class StartStep:
    """Hosts started together (in parallel); then the pause before the next step."""

    nodes: Tuple[NodePlan, ...]
    gap_after_s: float = 0.0


def start_steps(plan: LaunchPlan, coordinator_ready: bool) -> Tuple[StartStep, ...]:
    """The steps of a start. order rank: one host a step, the gap after each but the last. order all: every
    host at once when rank 0's host already listens for the others' supervisors (a first attempt: bound
    during the push), else rank 0's host first (its start answer names the port), then the rest."""
    nodes = plan.nodes
    if plan.start_order == "rank":
        return tuple(StartStep((n,), plan.start_gap_s if i < len(nodes) - 1 else 0.0) for i, n in enumerate(nodes))
    if len(nodes) == 1 or coordinator_ready:
        return (StartStep(tuple(nodes)),)
    return (StartStep(tuple(nodes[:1])), StartStep(tuple(nodes[1:])))


def ranks_text(node: NodePlan) -> str:
    """`r0`, `r2-r3`: the ranks clusterrun gives a host."""
    ranks = [r.rank for r in node.ranks]
    if not ranks:
        return "no ranks"
    return f"r{ranks[0]}" if len(ranks) == 1 else f"r{ranks[0]}-r{ranks[-1]}"


def order_lines(plan: LaunchPlan) -> List[str]:
    """The dry run's account of the start: every host at once, or each rank's earliest start (seconds after
    the first, counting the gaps only: each start itself takes a moment more)."""
    if plan.start_order != "rank":
        return ["# start: every host at once (job.start.order: all)"]
    gap = plan.start_gap_s
    lines = [f"# start: in rank order, host after host, {gap:g} s after the one before has started its ranks "
             "(job.start)"]
    at = 0.0
    for i, node in enumerate(plan.nodes):
        if node.torchrun:  # torchrun starts the host's workers itself
            lines.append(f"#   +{at:g} s  {node.host.name} torchrun ({ranks_text(node)})")
        else:
            for j, rank in enumerate(node.ranks):
                lines.append(f"#   +{at:g} s  {node.host.name} r{rank.rank}")
                if j < len(node.ranks) - 1:
                    at += gap
        if i < len(plan.nodes) - 1:
            at += gap
    return lines


def start_all(plan: LaunchPlan, steps: Sequence[StartStep], start: Callable[[Sequence[NodePlan]], None],
              stopped: Callable[[], bool], emit: Callable[[object], None],
              sleep: Callable[[float], None] = time.sleep) -> bool:
    """Walk the steps: start each step's hosts (start raises when one fails: the run stops as any failed
    start does), pause its gap. False when stopped (Ctrl-C) before every step was taken."""
    ordered = plan.start_order == "rank"
    for i, step in enumerate(steps):
        if i and stopped():
            return False
        if ordered:
            node = step.nodes[0]
            emit(Starting(node.host.name, ranks_text(node), i + 1, len(steps),
                          steps[i - 1].gap_after_s if i else 0.0))
        start(step.nodes)
        if step.gap_after_s and not _pause(step.gap_after_s, stopped, sleep):
            return False
    return True


def _pause(seconds: float, stopped: Callable[[], bool], sleep: Callable[[float], None]) -> bool:
    """Sleep the gap in short naps; False as soon as the launch is stopped."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return True
        if stopped():
            return False
        sleep(min(0.05, left))
