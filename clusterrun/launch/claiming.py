"""One launch's claims on its hosts' slots and GPUs (the rule and the hosts' side: remote/host/share/; the
hosts' entries as records: hosts/claims.py): the request each host's push carries, the meeting point every
host's push comes to before a byte of the job is sent (ClaimGroup), the GPUs each claim took, what a
start carries of the claim, how --detach --wait's waiters meet, and why a push failed, busy or not.

The launch's verdict, from every host's first answer (one round): every host took its claim → each is
confirmed, the pushes go on; any host busy → without --wait every host gives its claim back and the
launch fails with exit 5 before anything was pushed (HostsBusy, with who holds what); with --wait the
hosts that took theirs give them back and get in line, and the hosts are probed (PROBE_S) until each says
it would say yes now; then every host is asked to take its claim again, at once (the next round). With
--detach --wait the launch does not wait here: its hosts get in line, the push goes on, and the hosts
wait for their turn among themselves (remote/host/share/waiter.py).
"""

from __future__ import annotations

import getpass
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

from ..config.inventory import Inventory
from ..errors import ClaimDropped, ConnectError, GpuCheckFailed, HostBusy, HostsBusy, HostsFailed
from ..hosts.claims import WaitStatus, busy_error
from ..plan import LaunchPlan, NodePlan

PROBE_S = 1.0  # a waiting launch asks each host how it stands this often
CONTEND_S = 10.0  # the most a host waits out a younger launch's tentative claim (share/claims.py)


def who() -> str:
    """The controller's user@machine, written into every claim (the host names the login user itself)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


# -------------------------------------------------------------- the request


def claim_request(inv: Inventory, plan: LaunchPlan, node: NodePlan, *, ticket: Tuple[float, str], wait: bool,
                  detach: bool, by: str) -> Optional[dict]:
    """What node's push asks its host for (remote/host/share/claims.py); None where claims are off."""
    host = node.host
    if not host.claims_dir:
        return None
    gpus = list(host.gpus) if isinstance(host.gpus, tuple) else host.gpus
    return {"dir": host.claims_dir, "run": plan.run_id, "node": host.name, "by": by, "slots": len(node.ranks),
            "gpus": gpus, "gpu_count": len(node.ranks), "capacity": host.claim_slots,
            "ticket": [ticket[0], ticket[1]], "wait": wait, "detach": detach,
            "contend": min(CONTEND_S, inv.timeouts.command / 3), "silence": inv.timeouts.command}


def wait_mesh(inv: Inventory, plan: LaunchPlan, node: NodePlan, *, token: str, port: Optional[int],
              timeout: Optional[float]) -> dict:
    """How node's waiter meets the others (remote/host/share/waiter.py): rank 0's host's coordinates on the
    port it bound during the push; the others join it, from their own addresses."""
    t = inv.timeouts
    common = {"token": token, "run": plan.attempt_key, "host_lost": t.host_lost, "timeout": timeout,
              "join_timeout": t.command + t.host_lost, "bind": node.host.master_addr, "node_rank": node.node_rank}
    if node.node_rank == 0:
        return {**common, "coordinator": True, "expect": [n.node_rank for n in plan.nodes[1:]],
                "allow": sorted({n.host.master_addr for n in plan.nodes})}
    return {**common, "addr": plan.master_addr, "port": port}


def start_claim(inv: Inventory, plan: LaunchPlan, request: Optional[dict], gpus: Sequence[int], *,
                detached: bool = False) -> Optional[dict]:
    """What a start spec carries of the claim: the request, the GPUs taken, and how long the claim stays
    after a failed attempt for the next one (job.restarts; none once no attempt is left, nor detached:
    restarts are the controller's)."""
    if request is None:
        return None
    left = 0 if detached else inv.job.restarts - plan.attempt
    keep = inv.job.restart_delay_s + inv.timeouts.command if left > 0 else 0.0
    return {**request, "taken_gpus": list(gpus), "keep_s": keep}


# -------------------------------------------------------------- the launch's verdict


@dataclass
class ClaimGroup:
    """Every host's push thread meets here after the host's claim answer (see the module docstring).
    `answer` reports one round's answer and returns the verdict ("go", "requeue", "handoff", "queued");
    a busy host raises HostBusy and a free one ClaimDropped when the launch cannot go and does not wait."""

    names: Sequence[str]
    wait: bool = False
    detach: bool = False
    wait_timeout: Optional[float] = None
    notify: Callable[[WaitStatus], None] = lambda status: None
    _round: int = 0
    _answers: Dict[int, Tuple[str, dict]] = field(default_factory=dict)
    _status: Dict[int, dict] = field(default_factory=dict)
    _latest: Dict[int, dict] = field(default_factory=dict)  # each host's last known status (shown, reported)
    _tried: Dict[int, int] = field(default_factory=dict)
    _verdicts: Dict[int, str] = field(default_factory=dict)
    _failed: str = ""
    _t0: float = field(default_factory=time.monotonic)
    _shown: Optional[WaitStatus] = None
    _queued_at: Optional[float] = None  # when a host first said it is not free
    _went_at: Optional[float] = None  # when every host said yes
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def waited(self) -> float:
        return time.monotonic() - self._t0

    @property
    def wait_seconds(self) -> float:
        """How long the launch stood in line before every host said yes (0 when it never did)."""
        if self._queued_at is None or self._went_at is None:
            return 0.0
        return max(0.0, self._went_at - self._queued_at)

    @property
    def handed_off(self) -> bool:
        """--detach --wait found a host busy: the hosts wait for their turn themselves."""
        return "handoff" in self._verdicts.values()

    def answer(self, index: int, round_no: int, kind: str, info: dict) -> str:
        with self._cond:
            self._answers[index] = (kind, info)
            if kind == "queued":
                self._status[index] = self._latest[index] = info
                self._queued_at = self._queued_at or time.monotonic()
            self._settle(round_no)
            self._show()
            if kind == "queued" and self.wait and not self.detach:
                return "queued"  # the host's thread probes from here on
            while round_no not in self._verdicts:
                self._check(index)
                self._cond.wait(0.2)
            verdict = self._verdicts[round_no]
        if verdict == "busy":
            if kind == "busy":
                raise busy_error(self.names[index], info)
            raise ClaimDropped(self.names[index], "free here, but another host of the launch is busy")
        return verdict

    def _settle(self, round_no: int) -> None:
        if round_no in self._verdicts or len(self._answers) < len(self.names):
            return
        kinds = {kind for kind, _ in self._answers.values()}
        if kinds == {"granted"}:
            verdict = "go"
            self._went_at = time.monotonic()
        elif "busy" in kinds or not self.wait:
            verdict = "busy"
        else:
            verdict = "handoff" if self.detach else "requeue"
        self._verdicts[round_no] = verdict
        self._cond.notify_all()

    def status(self, index: int, info: dict) -> None:
        """A probe's answer (or the one after a requeue): how the host stands now."""
        with self._cond:
            self._status[index] = self._latest[index] = info
            if self._round in self._verdicts and len(self._status) == len(self.names) and \
                    all(s.get("ready") for s in self._status.values()):
                self._round += 1  # every host would say yes now: ask them all to take their claims again
                self._answers, self._status = {}, {}
                self._cond.notify_all()
            self._show()

    def next_action(self, index: int) -> Tuple[str, int]:
        """("try", round) once a new round begins, else ("probe", -1) after PROBE_S."""
        end = time.monotonic() + PROBE_S
        with self._cond:
            while True:
                self._check(index)
                if self._round > self._tried.get(index, 0):
                    self._tried[index] = self._round
                    return "try", self._round
                left = end - time.monotonic()
                if left <= 0:
                    return "probe", -1
                self._cond.wait(left)

    def fail(self, index: int, why: str = "") -> None:
        """This host will not answer (its connection or push failed): nobody waits for it."""
        with self._cond:
            self._failed = self._failed or why or f"{self.names[index]} failed"
            self._cond.notify_all()

    def abort(self) -> None:
        self.fail(0, "the launch was abandoned")

    def _check(self, index: int) -> None:
        """Raise in a waiting thread when the launch gave up (a host failed, Ctrl-C, the timeout)."""
        if self._failed:
            raise ClaimDropped(self.names[index], f"not claimed: {self._failed}")
        if self.wait_timeout is not None and self.waited > self.wait_timeout:
            self._failed = f"still busy after {self.wait_timeout:g} s"
            self._cond.notify_all()
            latest = self._latest.get(index)
            if latest is not None and not latest.get("ready"):
                raise busy_error(self.names[index], latest, waited=self.waited)
            raise ClaimDropped(self.names[index], f"not claimed: {self._failed}")

    def _show(self) -> None:
        if len(self._latest) < len(self.names) or not self.wait:
            return  # until every host has said how it stands
        status = WaitStatus.from_wire({self.names[i]: s for i, s in sorted(self._latest.items())}, self.waited)
        if self._shown is None or self._shown.hosts != status.hosts:
            self._shown = status
            self.notify(status)


# -------------------------------------------------------------- one launch


class LaunchClaims:
    def __init__(self, inv: Inventory, run_id: str, *, wait: bool, wait_timeout: Optional[float], detach: bool,
                 on_wait: Callable[[WaitStatus, bool], None]):
        """on_wait(status, first): from a push thread, the launch's place in line changed (first: it waits
        now, which it did not before)."""
        self.inv, self.wait, self.wait_timeout, self.detach = inv, wait, wait_timeout, detach
        self.ticket = (time.time(), run_id)  # the launch's place in line on every host
        self.group: Optional[ClaimGroup] = None
        self.requests: Dict[int, dict] = {}  # by inventory index; hosts with claims off have none
        self.gpus: Dict[int, Tuple[int, ...]] = {}  # the GPUs each host's claim took
        self.waited = False
        self._on_wait = on_wait
        self._lock = threading.Lock()

    def begin(self, plan: LaunchPlan) -> Optional[ClaimGroup]:
        """Where every host's push meets with its claim answer; None when no host claims."""
        by = who()
        for node in plan.nodes:
            request = claim_request(self.inv, plan, node, ticket=self.ticket, wait=self.wait, detach=self.detach,
                                    by=by)
            if request is not None:
                self.requests[node.index] = request
        if self.requests:
            names = [n.host.name for n in plan.nodes if n.index in self.requests]
            self.group = ClaimGroup(names, wait=self.wait, detach=self.detach, wait_timeout=self.wait_timeout,
                                    notify=self._notify)
        return self.group

    def _notify(self, status: WaitStatus) -> None:
        with self._lock:
            first, self.waited = not self.waited, True
        self._on_wait(status, first)

    def of(self, plan: LaunchPlan, node: NodePlan):
        """(request, group, place) for this host's push, or None where it does not claim."""
        if self.group is None or node.index not in self.requests:
            return None
        seat = [n.index for n in plan.nodes if n.index in self.requests].index(node.index)
        return self.requests[node.index], self.group, seat

    def took(self, index: int, claim: Optional[dict]) -> None:
        """What the host at this place in the inventory answered it took ({"granted": GPUs}, ...)."""
        if claim and claim.get("granted"):
            with self._lock:
                self.gpus[index] = tuple(claim["granted"])

    def avoid(self, index: int, usable: Sequence[int], count: int) -> None:
        """Only these GPUs for the host at this place in the inventory (the GPU preflight failed the
        others): its claim chooses among them; without claims its ranks get the first `count`."""
        with self._lock:
            if index in self.requests:
                self.requests[index] = {**self.requests[index], "gpus": list(usable)}
            else:
                self.gpus[index] = tuple(usable[:count])

    def gpus_of(self, index: int) -> Tuple[int, ...]:
        with self._lock:
            return self.gpus.get(index, ())

    def for_start(self, plan: LaunchPlan, node: NodePlan) -> Optional[dict]:
        """The claim a host's supervisor adopts at the start (None where the host does not claim)."""
        return start_claim(self.inv, plan, self.requests.get(node.index), self.gpus_of(node.index),
                           detached=self.detach)

    @property
    def wait_seconds(self) -> float:
        """The time spent in line (not the push's)."""
        return self.group.wait_seconds if self.group is not None else 0.0

    @property
    def handed_off(self) -> bool:
        """--detach --wait with a host busy: the hosts' waiters start the run in its turn."""
        return self.group is not None and self.group.handed_off

    def abort(self) -> None:
        """A push thread still waiting in line stops waiting."""
        if self.group is not None:
            self.group.abort()


def prepare_failure(exc: HostsFailed, claims: LaunchClaims) -> HostsFailed:
    """Why connect-and-push failed: busy hosts (exit 5, who holds what), else the hosts that failed; a host
    that only gave its claim back because of another host is not one of them."""
    failures = {n: e for n, e in exc.failures.items() if not isinstance(e, ClaimDropped)} or exc.failures
    if any(isinstance(e, HostBusy) for e in failures.values()) or \
            all(isinstance(e, ClaimDropped) for e in failures.values()):
        waited = claims.group.waited if claims.group is not None and claims.wait else None
        return HostsBusy(failures, waited=waited)
    kinds = {"connect" if isinstance(e, ConnectError) else "GPU preflight" if isinstance(e, GpuCheckFailed)
             else "push" for e in failures.values()}
    return HostsFailed(" and ".join(sorted(kinds, reverse=False)), failures)
