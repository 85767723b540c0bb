"""What a run reports as it goes (events, for the UI) and what it ends with (results)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple


@dataclass(frozen=True)
class Phase:
    name: str  # connect | push | start | run | stop
    detail: str = ""


@dataclass(frozen=True)
class HostProgress:
    phase: str
    host: str
    done: int = 0
    total: int = 0


@dataclass(frozen=True)
class HostDone:
    phase: str
    host: str
    seconds: float
    detail: str = ""


@dataclass(frozen=True)
class LogLines:
    """Whole lines (bytes, each ending in a newline) of one rank, in order."""

    host: str
    node_rank: int
    rank: int
    data: bytes


@dataclass(frozen=True)
class RankEnded:
    host: str
    rank: int
    description: str
    failed: bool


@dataclass(frozen=True)
class Notice:
    text: str
    level: str = "info"  # info | warning | error


@dataclass(frozen=True)
class RankResult:
    rank: int
    node_rank: int
    host: str
    state: str  # succeeded | failed | stopped | lost | not-started
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None  # controller clock (host clock corrected by the measured offset)
    log_path: str = ""
    tail: Tuple[str, ...] = ()
    note: str = ""

    @property
    def duration(self) -> Optional[float]:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)

    def describe(self) -> str:
        if self.state == "lost":
            return f"lost ({self.note})" if self.note else "lost"
        if self.state == "stopped":
            how = f" ({_signal_name(self.signal)})" if self.signal else \
                (f" (exit code {self.exit_code})" if self.exit_code is not None else "")
            return f"stopped by clusterrun{how}" if not self.note else f"stopped: {self.note}"
        if self.signal:
            return f"killed by signal {self.signal} ({_signal_name(self.signal)})"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return self.note or self.state


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    state: str  # succeeded | failed | stopped | timed-out | interrupted | running (detached)
    exit_code: int
    reason: str = ""
    root_cause: Optional[RankResult] = None
    ranks: Tuple[RankResult, ...] = ()
    cleanup_pending: Tuple[str, ...] = ()
    seconds: float = 0.0
    phases: Tuple[Tuple[str, float], ...] = field(default=())


def _signal_name(sig: int) -> str:
    import signal

    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
