"""The processes that hold a host's GPU devices, as the host labelled them (remote/host/share/leftovers.py):
the request, the record and the words every view says them in (the GPU preflight, `clean --leftovers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence, Tuple

if TYPE_CHECKING:
    from ..config.hosts import Host


def leftovers_request(host: "Host", run: str = "", kill: str = "") -> dict:
    """What a host's `leftovers` is asked (remote/host/share/leftovers.py)."""
    return {"devices": host.gpu_devices, "claims_dir": host.claims_dir or "", "run": run, "kill": kill}


def holder_text(h: Mapping) -> str:
    """`pid 4242 (python worker.py, user cr, 1200 MiB) left by ended run 20261202-1200-ab12: `clusterrun clean
    --leftovers 20261202-1200-ab12` ends it`: one holder of a GPU device, as every view says it."""
    mem = f", {h['mem_mib']:.0f} MiB" if h.get("mem_mib") else ""
    who = f"pid {h.get('pid')} ({(h.get('command') or '?')[:60]}, user {h.get('user')}{mem})"
    words = {"ended-run": f"left by ended run {h.get('run')}: `clusterrun clean --leftovers {h.get('run')}` ends it",
             "live-run": f"of live run {h.get('run')}", "this-run": "of this run",
             "claim": f"of {h.get('user')}'s live run {h.get('run')} (its claim)"}.get(h.get("label") or "",
                                                                                  "not a clusterrun run's")
    return f"{who} {words}"



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
