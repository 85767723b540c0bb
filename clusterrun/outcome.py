"""How a run ended, worked out in one place: the live monitor and `ps`/`stop` (the registry) both call
`decide`, so the same rank reads the same wherever it is shown.

The root cause leads (torchrun's "first observed failure"): of the ranks that failed or were lost, the
one that ended first on the controller's clock (host clocks corrected), ties broken by rank.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Tuple

from .errors import EXIT_FAILED
from .states import RankState, RunState


@dataclass(frozen=True)
class RankResult:
    """One rank as it ended (or stands): live in the monitor, or read back from the registry."""

    rank: int
    node_rank: int
    host: str
    state: RankState
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None  # controller clock (host clock corrected by the measured offset)
    log_path: str = ""
    tail: Tuple[str, ...] = ()
    note: str = ""
    stop_reason: str = ""  # why it was stopped, when it was (time-limit, failed elsewhere, ...)

    @property
    def duration(self) -> Optional[float]:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)

    def describe(self) -> str:
        state = RankState(self.state)
        if state is RankState.LOST:
            return f"lost ({self.note})" if self.note else "lost"
        if state is RankState.STOPPED:
            if self.note:
                return f"stopped: {self.note}"
            if self.signal:
                return f"stopped by clusterrun ({signal_name(self.signal)})"
            return f"stopped by clusterrun (exit code {self.exit_code})" if self.exit_code is not None \
                else "stopped by clusterrun"
        if self.signal:
            return f"killed by signal {self.signal} ({signal_name(self.signal)})"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return self.note or state.value


@dataclass(frozen=True)
class Verdict:
    state: RunState
    exit_code: int
    reason: str
    root_cause: Optional[RankResult]


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    state: RunState
    exit_code: int
    reason: str = ""
    root_cause: Optional[RankResult] = None
    ranks: Tuple[RankResult, ...] = ()
    cleanup_pending: Tuple[str, ...] = ()
    seconds: float = 0.0
    phases: Tuple[Tuple[str, float], ...] = field(default=())
    attempts: Tuple["AttemptSummary", ...] = ()  # job.restarts: every attempt, the last one included


@dataclass(frozen=True)
class AttemptSummary:
    """One attempt of a run that restarts: where it ran, how it ended, its first failure."""

    attempt: int
    hosts: Tuple[str, ...]
    world_size: int
    state: RunState
    reason: str
    dropped: Tuple[str, ...] = ()  # hosts of the attempt before that it went on without, with why


def exit_state(info: Mapping) -> RankState:
    """A host's exit record of a rank (remote/host/supervise.py writes them) → the rank's state."""
    if info.get("lost"):
        return RankState.LOST
    if info.get("exit_code") == 0:
        return RankState.SUCCEEDED
    if info.get("stopped"):
        return RankState.STOPPED
    return RankState.FAILED


# What a rank's last lines say → what the user should change (one line, under the root cause).
_HINTS = (
    (re.compile(r"unrecognized arguments:.*--(rank|world-size)"),
     "the script does not take --rank/--world-size: set job.rank_flags: false (it gets RANK, WORLD_SIZE, "
     "LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its environment), or launcher: torchrun"),
    (re.compile(r"arguments are required:.*--(rank|world-size)"),
     "the script wants --rank/--world-size: set job.rank_flags: true, or pass them in job.args with "
     "placeholders ({rank}, {world_size})"),
)


def hint_for(result: RankResult) -> str:
    """A hint for the root cause, from the rank's last log lines ("" when none applies)."""
    text = "\n".join(result.tail)
    return next((hint for pattern, hint in _HINTS if pattern.search(text)), "")


def signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def root_cause(ranks: Sequence[RankResult]) -> Optional[RankResult]:
    failures = sorted((r for r in ranks if RankState(r.state).failed),
                      key=lambda r: (r.ended_at if r.ended_at is not None else float("inf"), r.rank))
    return failures[0] if failures else None


def decide(ranks: Sequence[RankResult], *, stop_reason: Optional[str] = None, time_limit: Optional[float] = None,
           stopped_reason: str = "") -> Optional[Verdict]:
    """The run's end from its ranks, or None while a rank may still run and nothing forces the end.

    stop_reason: why clusterrun stopped the run, if it did: "interrupted" (Ctrl-C), "time-limit",
    "failed" (first-failure teardown) or "stopped" (`clusterrun stop`). stopped_reason: what to say
    when the ranks were stopped without failing (the recorded reason, if any).
    """
    root = root_cause(ranks)
    if stop_reason is None and all(RankState(r.state).terminal for r in ranks) and \
            any(r.stop_reason == "time-limit" for r in ranks):
        stop_reason = "time-limit"  # the hosts' supervisors enforced it (no controller was there)
    if stop_reason == "interrupted":
        return Verdict(RunState.INTERRUPTED, RunState.INTERRUPTED.exit_code, "interrupted by the user (Ctrl-C)",
                       root)
    if stop_reason == "time-limit":
        limit = f" of {time_limit:g} s" if time_limit else ""
        return Verdict(RunState.TIMED_OUT, RunState.TIMED_OUT.exit_code, f"time limit{limit} reached", root)
    states = [RankState(r.state) for r in ranks]
    if root is not None and (stop_reason is not None or all(s.terminal for s in states)):
        return Verdict(RunState.FAILED, EXIT_FAILED, f"rank {root.rank} on {root.host}: {root.describe()}", root)
    if not all(s.terminal for s in states):
        return None
    if all(s is RankState.SUCCEEDED for s in states):
        return Verdict(RunState.SUCCEEDED, RunState.SUCCEEDED.exit_code, "", None)
    if RankState.NOT_STARTED in states:
        return Verdict(RunState.FAILED, EXIT_FAILED,
                       stopped_reason or "the controller ended before every rank started", None)
    return Verdict(RunState.STOPPED, RunState.STOPPED.exit_code,
                   stopped_reason or "stopped before the job finished (clusterrun stop?)", None)
