"""Claims, the controller's part (the host's: remote/host/share/): the request each host's push carries,
the meeting point every host's push comes to before a byte of the job is sent (ClaimGroup), the host
entries as records (Holder), and every host's claims folder listed (`ps --hosts`, `top`).

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
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import ClaimDropped, HostBusy, HostError
from .group import GroupResult, on_hosts

if TYPE_CHECKING:
    from ..config.inventory import Host, Inventory
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


@dataclass(frozen=True)
class Holder:
    """One claim or queue entry on a host, as the host reported it (times on the host's clock)."""

    host: str
    kind: str  # claim | queue
    user: str  # the login user on the host that owns the entry
    by: str  # the controller's user@machine
    run: str
    node: str
    slots: int
    gpus: Union[str, Tuple[int, ...]]  # indices; a queue entry: the ones it named, or "any"
    since: float
    state: str  # tentative | held | running | kept | waiting
    live: bool = True
    position: Optional[int] = None  # a queue entry: its place in line on that host
    ticket: Tuple[float, str] = (0.0, "")

    @classmethod
    def from_wire(cls, host: str, d: dict) -> "Holder":
        gpus = d.get("gpus")
        ticket = d.get("ticket") or [0.0, ""]
        return cls(host=host, kind=str(d.get("kind") or "claim"), user=str(d.get("user") or "?"),
                   by=str(d.get("by") or ""), run=str(d.get("run") or ""), node=str(d.get("node") or ""),
                   slots=int(d.get("slots") or 0), gpus=tuple(gpus) if isinstance(gpus, list) else str(gpus or ""),
                   since=float(d.get("since") or 0.0), state=str(d.get("state") or ""), live=bool(d.get("live", True)),
                   position=d.get("position"), ticket=(float(ticket[0]), str(ticket[1])))

    def gpu_text(self) -> str:
        if isinstance(self.gpus, tuple):
            return ",".join(str(i) for i in self.gpus) or "-"
        return self.gpus or "-"

    def describe(self) -> str:
        """`bob (bob@laptop-b) run 20261201-1200-ab12: 2 slots, GPUs 0,1, running since 12:00:03`"""
        what = f"{self.slots} slot{'s' if self.slots != 1 else ''}" + (
            f", GPUs {self.gpu_text()}" if self.gpu_text() != "-" else "")
        when = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since else "?"
        state = "waiting" if self.kind == "queue" else self.state
        return f"{self.user} ({self.by}) run {self.run}: {what}, {state} since {when}"

    def to_json(self) -> dict:
        return {"host": self.host, "kind": self.kind, "user": self.user, "by": self.by, "run": self.run,
                "node": self.node, "slots": self.slots,
                "gpus": list(self.gpus) if isinstance(self.gpus, tuple) else self.gpus, "since": self.since,
                "state": self.state, "live": self.live, "position": self.position, "ticket": list(self.ticket)}


def holders_of(host: str, entries: Sequence[dict]) -> Tuple[Holder, ...]:
    return tuple(Holder.from_wire(host, e) for e in entries or ())


def busy_error(host: str, status: dict, *, waited: Optional[float] = None) -> HostBusy:
    """A host's busy (or still-queued) answer as the error naming who is in the way."""
    holders, ahead = holders_of(host, status.get("holders")), holders_of(host, status.get("ahead"))
    parts = [f"held by {h.describe()}" for h in holders] + [f"{h.describe()} is ahead in line" for h in ahead]
    text = "; ".join(parts) or status.get("why") or "busy"
    if waited is not None:
        text = f"still {text}"
    return HostBusy(host, text, holders=holders, ahead=ahead)


# -------------------------------------------------------------- the request


def claim_request(inv: "Inventory", plan: "LaunchPlan", node: "NodePlan", *, ticket: Tuple[float, str], wait: bool,
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


def wait_mesh(inv: "Inventory", plan: "LaunchPlan", node: "NodePlan", *, token: str, port: Optional[int],
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


def start_claim(inv: "Inventory", plan: "LaunchPlan", request: Optional[dict], gpus: Sequence[int], *,
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


@dataclass(frozen=True)
class HostWait:
    """Where one host of a waiting launch stands."""

    host: str
    ready: bool
    position: int
    holders: Tuple[Holder, ...]
    ahead: Tuple[Holder, ...]


@dataclass(frozen=True)
class WaitStatus:
    """A waiting launch's place on every host (what the terminal shows)."""

    hosts: Tuple[HostWait, ...]
    waited: float


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
        hosts = tuple(HostWait(self.names[i], bool(s.get("ready")), int(s.get("position") or 1),
                               holders_of(self.names[i], s.get("holders")), holders_of(self.names[i], s.get("ahead")))
                      for i, s in sorted(self._latest.items()))
        status = WaitStatus(hosts, self.waited)
        if self._shown is None or self._shown.hosts != status.hosts:
            self._shown = status
            self.notify(status)


# -------------------------------------------------------------- listing (ps --hosts, top)


@dataclass(frozen=True)
class HostClaims:
    """Every entry in one host's claims folder, any user's, and that host's clock."""

    host: str
    folder: str
    entries: Tuple[Holder, ...]
    now: float
    cpus: int
    user: str  # the login user that asked

    def to_json(self) -> dict:
        return {"host": self.host, "folder": self.folder, "now": self.now, "cpus": self.cpus, "user": self.user,
                "entries": [e.to_json() for e in self.entries]}


def list_claims(hosts: Sequence["Host"], connect: Callable[["Host"], Any]) -> GroupResult:
    """Each host's claims (HostClaims) by host name, in parallel; errors per host. Hosts with claims off
    are left out. `clusterrun ps --hosts` shows this; `top` can call it the same way."""
    wanted = [h for h in hosts if h.claims_dir]

    def one(host: "Host", client: Any) -> HostClaims:  # a hosts.client.HostClient
        answer = client.claims([host.claims_dir or ""])
        folder, entries = next(iter(answer["dirs"].items()))
        queue_rank = _positions(entries)
        return HostClaims(host.name, folder, tuple(Holder.from_wire(host.name, dict(e, position=queue_rank.get(i)))
                                                   for i, e in enumerate(entries)),
                          float(answer.get("now") or time.time()), int(answer.get("cpus") or 0),
                          str(answer.get("user") or ""))

    return on_hosts(wanted, connect, one, host=lambda h: h, thread_name="claims")


def _positions(entries: Sequence[dict]) -> Dict[int, int]:
    """Index → place in line of each live queue entry (by ticket)."""
    queued = sorted((tuple(e.get("ticket") or [0, ""]), i) for i, e in enumerate(entries)
                    if e.get("kind") == "queue" and e.get("live"))
    return {i: n for n, (_, i) in enumerate(queued, 1)}


def run_owner(listing: GroupResult, run_id: str) -> List[Holder]:
    """The live entries of a run (or a unique prefix of its id) in a listing."""
    return [e for hc in listing.results.values() for e in hc.entries
            if e.live and (e.run == run_id or e.run.startswith(run_id))]


def host_errors(listing: GroupResult) -> Dict[str, HostError]:
    return listing.failed
