"""`top`'s samples as records: what a host's `samples` command sends, one JSON line each
(remote/host/observe/samples.py writes them; its docstring is the schema), read once, here, so that the
view, the stragglers and the terminal use fields rather than dict keys.

A host is another machine, maybe running another clusterrun: a field that is missing or of the wrong type
reads as None (not known) and is shown as "-", a rank entry without a rank number or a claim entry that
does not parse is left out; one odd value never breaks the view. Only a line that is not a JSON object at
all is an error (ValueError, which `top` shows as that host's error).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple

from ..hosts.claims import Holder


def number(v: Any) -> Optional[float]:
    """An int or float as it came (JSON's true and false are not numbers); anything else None."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def count(v: Any) -> Optional[int]:
    """An int as it came; anything else (a float too) None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class GpuLoad:
    """One GPU as nvidia-smi reported it (memory in bytes)."""

    index: int
    util_pct: Optional[float] = None
    mem_used: Optional[int] = None
    mem_total: Optional[int] = None

    @classmethod
    def from_wire(cls, d: Any, position: int) -> "GpuLoad":
        d = d if isinstance(d, dict) else {}
        index = count(d.get("index"))
        return cls(position if index is None else index, number(d.get("util_pct")), count(d.get("mem_used")),
                   count(d.get("mem_total")))

    def to_json(self) -> dict:
        return {"index": self.index, "util_pct": self.util_pct, "mem_used": self.mem_used, "mem_total": self.mem_total}


@dataclass(frozen=True)
class HostLoad:
    """A host's own load: CPU of all cores together (100 = every core busy), load average, memory,
    network rates (bytes/s, every interface but lo) and its GPUs (None: no nvidia-smi there)."""

    cpu_pct: Optional[float] = None
    cores: Optional[int] = None
    load1: Optional[float] = None
    mem_used: Optional[int] = None
    mem_total: Optional[int] = None
    net_rx: Optional[int] = None
    net_tx: Optional[int] = None
    gpus: Optional[Tuple[GpuLoad, ...]] = None

    @classmethod
    def from_wire(cls, d: Any) -> "HostLoad":
        d = d if isinstance(d, dict) else {}
        gpus = d.get("gpus")
        return cls(number(d.get("cpu_pct")), count(d.get("cores")), number(d.get("load1")), count(d.get("mem_used")),
                   count(d.get("mem_total")), count(d.get("net_rx")), count(d.get("net_tx")),
                   tuple(GpuLoad.from_wire(g, i) for i, g in enumerate(gpus)) if isinstance(gpus, list) else None)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["gpus"] = None if self.gpus is None else [g.to_json() for g in self.gpus]
        return out


RANK_MEASURES = ("pid", "cpu_pct", "rss", "rss_children", "children", "last_output_s")


@dataclass(frozen=True)
class RankLoad:
    """One rank of the run on that host: its state and, while it runs, what its process and everything
    under it use (CPU in % of one core, as `top` counts; RSS in bytes), and seconds since its last line."""

    rank: int
    state: str = ""  # running | ended | pending
    pid: Optional[int] = None
    cpu_pct: Optional[float] = None
    rss: Optional[int] = None
    rss_children: Optional[int] = None
    children: Optional[int] = None
    last_output_s: Optional[float] = None

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_wire(cls, d: Any) -> Optional["RankLoad"]:
        """None when the entry names no rank (there is no row to put it in)."""
        if not isinstance(d, dict) or count(d.get("rank")) is None:
            return None
        state = d.get("state")
        return cls(d["rank"], state if isinstance(state, str) else "", count(d.get("pid")), number(d.get("cpu_pct")),
                   count(d.get("rss")), count(d.get("rss_children")), count(d.get("children")),
                   number(d.get("last_output_s")))

    def to_json(self) -> dict:
        """rank and state, and each measure the host could tell (an ended rank has no pid, CPU or RSS)."""
        measured = {name: getattr(self, name) for name in RANK_MEASURES if getattr(self, name) is not None}
        return {"rank": self.rank, "state": self.state, **measured}


@dataclass(frozen=True)
class Sample:
    """One line of a host's `samples`: the host's load, its ranks' (a run's), and for the host alone
    ("-") which clusterrun runs its supervisors run and every user's live claims and queue entries."""

    host: HostLoad
    ranks: Tuple[RankLoad, ...] = ()
    runs: Tuple[str, ...] = ()  # RUN or RUN/attempt-K
    claims: Tuple[Holder, ...] = ()
    now: Optional[float] = None  # the host's clock
    interval: Optional[float] = None  # seconds since its previous sample

    @classmethod
    def from_wire(cls, host: str, d: Any) -> "Sample":
        """host: the host's name (the claims' records carry it)."""
        if not isinstance(d, dict):
            raise ValueError(f"{host}: a sample that is not a JSON object: {str(d)[:80]!r}")
        ranks = (RankLoad.from_wire(r) for r in _list(d.get("ranks")))
        return cls(HostLoad.from_wire(d.get("host")), tuple(r for r in ranks if r is not None),
                   tuple(r for r in _list(d.get("runs")) if isinstance(r, str)), _claims(host, d.get("claims")),
                   number(d.get("now")), number(d.get("interval")))


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _claims(host: str, entries: Any) -> Tuple[Holder, ...]:
    out = []
    for e in _list(entries):
        try:
            out.append(Holder.from_wire(host, e))
        except (AttributeError, TypeError, ValueError, IndexError):  # not an entry this clusterrun can read
            continue
    return tuple(out)
