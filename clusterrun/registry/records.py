"""What the registry hands out: frozen records of a run, its hosts and its finished attempts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..outcome import RankResult
from ..states import Cleanup, HostState, RunState


@dataclass(frozen=True)
class AttemptRecord:
    """One finished attempt of a run that restarts (job.restarts): where it ran and how it ended."""

    attempt: int
    started_at: Optional[float]
    ended_at: Optional[float]
    hosts: Tuple[str, ...]
    world_size: int
    state: RunState
    exit_code: Optional[int]
    reason: str
    dropped: Tuple[str, ...]  # hosts of the attempt before that this one went on without, with why
    plan: Dict[str, Any]
    ranks: Tuple[RankResult, ...]

    def to_json(self) -> dict:
        return {"attempt": self.attempt + 1, "started_at": self.started_at, "ended_at": self.ended_at,
                "hosts": list(self.hosts), "world_size": self.world_size, "state": self.state.value,
                "exit_code": self.exit_code, "reason": self.reason, "dropped": list(self.dropped),
                "ranks": [r.to_json() for r in self.ranks]}


@dataclass(frozen=True)
class HostRecord:
    node_rank: int
    name: str
    state: HostState
    cleanup: Optional[Cleanup]  # pending: clusterrun still owes this host a stop
    error: Optional[str]
    supervisor_pid: Optional[int]
    pushed_bytes: Optional[int]
    push_seconds: Optional[float]
    restarts: int = 0  # launcher torchrun: how often it restarted this host's workers
    relayed_bytes: int = 0  # relay push: object bytes this host got from another host, not from the controller
    push_detail: Optional[Dict[str, Any]] = None  # where the push's time went on the host (its wall clock)
    stack: Optional[Dict[str, Any]] = None  # the stack fingerprint it ran on, and job.environment's venv

    def to_json(self) -> dict:
        return {"node_rank": self.node_rank, "name": self.name, "state": self.state.value,
                "cleanup": self.cleanup.value if self.cleanup else None, "error": self.error,
                "supervisor_pid": self.supervisor_pid, "pushed_bytes": self.pushed_bytes,
                "push_seconds": self.push_seconds, "restarts": self.restarts, "relayed_bytes": self.relayed_bytes,
                "push_detail": self.push_detail, "stack": self.stack}


@dataclass(frozen=True)
class RunRecord:
    id: str
    created_at: float
    inventory: str
    snapshot: Dict[str, Any]
    plan: Dict[str, Any]
    state: RunState
    exit_code: Optional[int]
    reason: Optional[str]
    ended_at: Optional[float]
    controller: Optional[Dict[str, Any]]
    detached: bool
    phases: Dict[str, float]  # seconds per phase of the launch: connect, push, start, run
    hosts: Tuple[HostRecord, ...]
    ranks: Tuple[RankResult, ...]  # the current (last) attempt's
    attempt: int = 0
    restarts: int = 0  # how many attempts after the first the run may have
    attempts: Tuple[AttemptRecord, ...] = ()  # the finished ones before the current
    pulled: Tuple[str, ...] = ()  # hosts its files were pulled from (a pull that completed)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def outputs(self) -> Tuple[str, ...]:
        """The inventory's job.outputs when the run was launched."""
        return tuple((self.snapshot.get("job") or {}).get("outputs") or ())

    @property
    def outputs_unpulled(self) -> bool:
        """The run names outputs (job.outputs) and no pull of them ever completed."""
        return bool(self.outputs) and not self.pulled

    @property
    def cleanup_pending(self) -> List[str]:
        return [h.name for h in self.hosts if h.cleanup is Cleanup.PENDING]

    @property
    def still_open(self) -> bool:
        """Something of the run may still run: it has not ended, or a host of it still owes a stop."""
        return not self.terminal or bool(self.cleanup_pending)

    def to_json(self) -> dict:
        return {"id": self.id, "state": self.state.value, "exit_code": self.exit_code, "reason": self.reason,
                "created_at": self.created_at, "ended_at": self.ended_at, "inventory": self.inventory,
                "detached": self.detached, "phases": self.phases, "hosts": [h.to_json() for h in self.hosts],
                "ranks": [r.to_json() for r in self.ranks], "cleanup_pending": self.cleanup_pending,
                "attempt": self.attempt + 1, "restarts": self.restarts,  # 1 for the first, as everywhere shown
                "attempts": [a.to_json() for a in self.attempts], "outputs": list(self.outputs),
                "pulled": list(self.pulled),
                # network.ifname: what each host's ranks were given and why (plan.NetChoice)
                "network": {n["name"]: n["network"] for n in self.plan.get("nodes", ()) if "network" in n}}
