"""The states a run, a rank and a host go through, as `str` Enums: stored and shown as their plain values.

A state knows whether it is final (`terminal`) and, for a run, which exit code it ends the CLI with.
"""

from __future__ import annotations

from enum import Enum

from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIME_LIMIT


class RunState(str, Enum):
    STARTING = "starting"  # connecting, pushing, starting
    WAITING = "waiting"  # launch --wait: queued for hosts other runs hold (share/claims.py)
    RUNNING = "running"
    UNREACHABLE = "unreachable"  # no controller, and a host could not be asked
    UNKNOWN = "unknown"  # stopped, but a host could not be reached to confirm
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    TIMED_OUT = "timed-out"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self in _RUN_TERMINAL

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for a run that ended in this state (1 for anything unfinished)."""
        return {RunState.SUCCEEDED: EXIT_OK, RunState.TIMED_OUT: EXIT_TIME_LIMIT,
                RunState.INTERRUPTED: EXIT_INTERRUPTED}.get(self, EXIT_FAILED)


_RUN_TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.TIMED_OUT,
                           RunState.INTERRUPTED})


class RankState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # non-zero exit or a signal it did not get from clusterrun
    STOPPED = "stopped"  # ended by clusterrun (teardown, `stop`, Ctrl-C, time limit)
    LOST = "lost"  # its host went silent, or nobody was left to record its exit
    NOT_STARTED = "not-started"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self not in (RankState.PENDING, RankState.RUNNING)

    @property
    def failed(self) -> bool:
        """A failure that is the run's root cause candidate (a stop by clusterrun is not one)."""
        return self in (RankState.FAILED, RankState.LOST)


class HostState(str, Enum):
    PENDING = "pending"
    PUSHING = "pushing"
    PUSHED = "pushed"
    STARTED = "started"
    DONE = "done"  # every rank of the host has an exit record
    STOPPED = "stopped"
    LOST = "lost"
    CONNECT_FAILED = "connect-failed"
    PREPARE_FAILED = "prepare-failed"
    START_FAILED = "start-failed"
    STOP_FAILED = "stop-failed"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def failed_in(cls, phase: str) -> "HostState":
        return cls(f"{phase}-failed") if f"{phase}-failed" in _HOST_VALUES else cls.PREPARE_FAILED


_HOST_VALUES = {s.value for s in HostState}


class Cleanup(str, Enum):
    """Whether clusterrun still owes a host a stop (it could not reach it when it tried)."""

    PENDING = "pending"
    DONE = "done"

    def __str__(self) -> str:
        return self.value
