"""One launch's claims on its hosts' slots and GPUs (the rule and the hosts' side: hosts/claims.py and
remote/host/share/): each claiming host's request, the ClaimGroup where every host's answer meets the
others' before a byte is pushed, the GPUs each claim took, and whether the launch waited in line."""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Optional, Tuple

from ..config.inventory import Inventory
from ..errors import ClaimDropped, ConnectError, HostBusy, HostsBusy, HostsFailed
from ..hosts.claims import ClaimGroup, WaitStatus, claim_request, start_claim, who
from ..plan import LaunchPlan, NodePlan


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
    kinds = {"connect" if isinstance(e, ConnectError) else "push" for e in failures.values()}
    return HostsFailed(" and ".join(sorted(kinds, reverse=False)), failures)
