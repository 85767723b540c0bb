"""Claims as the hosts report them (the host's side: remote/host/share/): each claim or queue entry as a
record (Holder), a busy answer as the error naming who is in the way, and every host's claims folder
listed (`ps --hosts`, `top`). What a launch does with its hosts' claims is launch/claiming.py's."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import HostBusy, HostError
from .group import GroupResult, on_hosts

if TYPE_CHECKING:
    from ..config.inventory import Host


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

    @classmethod
    def from_wire(cls, standings: Mapping[str, dict], waited: float) -> "WaitStatus":
        """Each host's standing as it said it ({"ready", "position", "holders", "ahead"}: the push's queued
        status, or a waiting run's `status`), in the order given."""
        return cls(tuple(HostWait(host, bool(s.get("ready")), int(s.get("position") or 1),
                                  holders_of(host, s.get("holders")), holders_of(host, s.get("ahead")))
                         for host, s in standings.items()), waited)


def busy_error(host: str, status: dict, *, waited: Optional[float] = None) -> HostBusy:
    """A host's busy (or still-queued) answer as the error naming who is in the way."""
    holders, ahead = holders_of(host, status.get("holders")), holders_of(host, status.get("ahead"))
    parts = [f"held by {h.describe()}" for h in holders] + [f"{h.describe()} is ahead in line" for h in ahead]
    text = "; ".join(parts) or status.get("why") or "busy"
    sums = arithmetic(host, status.get("sums") or {}, holders)
    if sums:
        text = f"{text} ({sums})"
    if waited is not None:
        text = f"still {text}"
    return HostBusy(host, text, holders=holders, ahead=ahead)


def arithmetic(host: str, sums: dict, holders: Sequence[Holder]) -> str:
    """`needs 2 slots; node0 offers 2, of which bob's run holds 1` (and the same of GPUs), from a busy
    answer's sums; "" when the host said none (an older host program) or the sums do not explain it."""
    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'s' if n != 1 else ''}"

    def held(count: int, field: str) -> str:
        whose = ", ".join(dict.fromkeys(f"{h.user}'s run {h.run}" for h in holders if getattr(h, field)))
        return f", of which {whose} hold{'s' if ',' not in whose else ''} {count}" if whose else ""

    need, capacity, used = sums.get("need"), sums.get("capacity"), sums.get("used", 0)
    out = []
    if isinstance(need, int) and isinstance(capacity, int) and used and need + used > capacity:
        out.append(f"needs {plural(need, 'slot')}; {host} offers {capacity}{held(used, 'slots')}")
    wanted, gpus = sums.get("gpus_wanted") or 0, sums.get("gpus")
    taken = sum(len(h.gpus) for h in holders if isinstance(h.gpus, tuple))
    if wanted and isinstance(gpus, int) and taken and wanted + taken > gpus:
        out.append(f"needs {plural(wanted, 'GPU')}; {host} has {gpus}{held(taken, 'gpus')}")
    return "; ".join(out)


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
