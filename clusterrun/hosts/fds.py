"""Open files for a fan-out: the soft RLIMIT_NOFILE raised at start to what the hosts need, and a clear
error naming the hard limit when even that is too low (pdsh breaks at a fan-out of about 500 on fds;
Linux's usual soft limit of 1024 is about 90 hosts' worth here).

What a host costs the controller while a launch follows it: its connection (an SSH socket; a
ProxyCommand's two pipes; a `local` host's pipes to its host program, two commands at once while the push
is held for the start), a reconnect's socket beside the old one, and the local copy of each rank's log and
of the host's other output (setup, torchrun's messages), each kept open while followed. Measured (peak of
/proc/PID/fd during a launch on `local` hosts, the costliest kind): 4 hosts x 1 rank 22, 16 x 2 86, 48 x 1
219, about 3.5 a host and 1 a rank; the estimate below gives 1.7-2x that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import FdLimitTooLow

BASE = 32  # the process itself: stdio, the registry (SQLite, its journal), the hash cache, Python's own
PER_HOST = 6  # its connection and a reconnect's, a proxy's or a local host's pipes, its two aux log copies
PER_RANK = 1  # its local log copy


def fds_needed(hosts: int, ranks: int) -> int:
    """Open files a command on `hosts` hosts running `ranks` ranks may hold at once."""
    return BASE + PER_HOST * hosts + PER_RANK * ranks


@dataclass(frozen=True)
class FdPlan:
    """What to do with the soft limit: set it to `soft` (None: leave it), or fail (`too_low`)."""

    soft: Optional[int]
    too_low: bool = False


def plan_limit(needed: int, soft: int, hard: int, infinity: int = -1) -> FdPlan:
    """Pure: raise the soft limit to what is needed when the hard limit allows it."""
    if soft == infinity or soft >= needed:
        return FdPlan(None)
    if hard != infinity and hard < needed:
        return FdPlan(None, too_low=True)
    return FdPlan(needed)


def ensure_fds(hosts: int, ranks: int, what: str = "") -> Tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to what hosts and ranks need (never lower it); (soft, hard) after.

    FdLimitTooLow when the hard limit is below it. Where there is no such limit (no `resource`
    module), nothing to do: (-1, -1)."""
    try:
        import resource
    except ImportError:
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = fds_needed(hosts, ranks)
    plan = plan_limit(needed, soft, hard, resource.RLIM_INFINITY)
    if plan.too_low:
        raise FdLimitTooLow(hosts, ranks, needed, hard, what)
    if plan.soft is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (plan.soft, hard))
        soft = plan.soft
    return soft, hard
