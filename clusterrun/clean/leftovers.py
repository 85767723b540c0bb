"""`clusterrun clean --leftovers [RUN | INVENTORY]`: the processes that hold the hosts' GPU devices, and
exactly an ended run's own among them killed (remote/host/share/leftovers.py decides, by the process
marker every rank carries; never by name, never another user's or an unmarked process)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from ..check.gpu_rules import holder_text, leftovers_request
from ..config.inventory import Host
from ..errors import HostError
from ..hosts.group import on_hosts

KILLABLE = "ended-run"


@dataclass(frozen=True)
class Leftover:
    """One process that holds a GPU device on a host, as the host labelled it."""

    host: str
    pid: int
    user: str
    label: str  # this-run | ended-run | live-run | claim | unknown
    run: str
    command: str
    gpus: Tuple[int, ...]
    devices: Tuple[str, ...]
    mem_mib: float = 0.0
    killed: bool = False

    @classmethod
    def from_wire(cls, host: str, d: Mapping, killed: Sequence[int] = ()) -> "Leftover":
        return cls(host, int(d["pid"]), str(d.get("user") or ""), str(d.get("label") or "unknown"),
                   str(d.get("run") or ""), str(d.get("command") or ""), tuple(int(i) for i in d.get("gpus") or ()),
                   tuple(d.get("devices") or ()), float(d.get("mem_mib") or 0.0), int(d["pid"]) in set(killed))

    def text(self) -> str:
        return holder_text({"pid": self.pid, "user": self.user, "label": self.label, "run": self.run,
                            "command": self.command, "mem_mib": self.mem_mib})

    def to_json(self) -> dict:
        return {"host": self.host, "pid": self.pid, "user": self.user, "label": self.label, "run": self.run,
                "command": self.command, "gpus": list(self.gpus), "devices": list(self.devices),
                "mem_mib": self.mem_mib, "killed": self.killed}


def leftovers(hosts: Sequence[Host], connect: Callable[[Host], object], kill: str = ""
              ) -> Tuple[List[Leftover], Dict[str, HostError]]:
    """Every host's GPU holders (kill: a run id, "*" for every ended run, "" to only list), in the hosts'
    order; and the hosts that failed."""
    def one(host: Host, client) -> List[Leftover]:
        answer = client.leftovers(leftovers_request(host, kill=kill))
        return [Leftover.from_wire(host.name, d, answer.get("killed") or ()) for d in answer.get("holders") or ()]

    found = on_hosts(list(hosts), connect, one, host=lambda h: h, thread_name="leftovers")
    return [x for h in hosts for x in found.results.get(h.name, [])], dict(found.errors)
