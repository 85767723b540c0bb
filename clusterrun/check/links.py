"""`clusterrun check --net`, the pure part: which pairs of hosts measure in which round, and what the
measurements say (pure: numbers in, verdicts out; bandwidth.py runs the rounds on the hosts).

Rounds: ⌈log2 N⌉ rounds of disjoint pairs in which every host meets a partner at distance 1, 2, 4, ...
(host i and i XOR 2^k: together they touch every host, and links inside and across halves of the
cluster), then every host's link to rank 0's host (the one every rendezvous uses) not measured yet,
each in the first round where neither end is busy. A round's pairs run at once; each pair measures its
link both ways at once (full duplex). The whole schedule runs REPEATS times, each with a share of the
budget, and a link's rate is the median of its short measurements: one slow moment of a loaded host is
not a slow link. A link whose median is under half the median of all is named slow, and the report says
how much a link's measurements varied (the noise), so a verdict can be weighed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

SLOW_FRACTION = 0.5  # a link under this share of the median link is slow
REPEATS = 3  # short measurements per link, the median kept


def rounds(n: int) -> List[List[Tuple[int, int]]]:
    """Pairs (a, b), a < b, by round: no host twice in a round; every host meets rank 0's host."""
    out: List[List[Tuple[int, int]]] = []
    for k in range(math.ceil(math.log2(n)) if n > 1 else 0):
        pairs = [(i, i ^ (1 << k)) for i in range(n) if i < i ^ (1 << k) < n]
        if pairs:
            out.append(pairs)
    done = {p for r in out for p in r}
    for j in range(1, n):
        if (0, j) in done:
            continue
        free = next((r for r in out if all(0 not in p and j not in p for p in r)), None)
        if free is None:
            free = []
            out.append(free)
        free.append((0, j))
    return out


@dataclass(frozen=True)
class Link:
    """One direction of a measured link: src sent, dst received."""

    src: str
    dst: str
    mbps: Optional[float]  # what dst received, in Mbit/s (None: the exchange failed)
    received: int = 0  # bytes
    seconds: float = 0.0
    rtt_ms: Optional[float] = None  # the pair's round trip (median of the pings)
    error: str = ""
    slow: bool = False
    samples: Tuple[float, ...] = ()  # each short measurement's Mbit/s (mbps is their median)

    def to_json(self) -> dict:
        return {"from": self.src, "to": self.dst, "mbps": self.mbps, "bytes": self.received,
                "seconds": self.seconds, "rtt_ms": self.rtt_ms, "error": self.error or None, "slow": self.slow,
                "samples": list(self.samples)}

    @property
    def spread(self) -> Optional[float]:
        """How far its measurements lay apart, as a share of their median (None: fewer than two)."""
        if len(self.samples) < 2 or not self.mbps:
            return None
        return (max(self.samples) - min(self.samples)) / self.mbps


def pair_links(src: str, dst: str, at_src: Mapping, at_dst: Mapping) -> Tuple[Link, Link]:
    """Both directions of one pair from its two hosts' answers (src connected, dst served): src → dst is
    what dst received, dst → src what src received."""
    rtt = at_src.get("rtt_ms")
    error = at_src.get("error") or at_dst.get("error") or ""
    return (_direction(src, dst, at_dst, rtt, error), _direction(dst, src, at_src, rtt, error))


def _direction(src: str, dst: str, receiver: Mapping, rtt: Optional[float], error: str) -> Link:
    received, seconds = int(receiver.get("received") or 0), float(receiver.get("receive_s") or 0.0)
    if error or not seconds or not received:
        return Link(src, dst, None, received, seconds, rtt, error or "nothing arrived")
    return Link(src, dst, round(received * 8 / seconds / 1e6, 1), received, seconds, rtt)


def combined(measured: Sequence[Link]) -> List[Link]:
    """One link per direction from its short measurements (in schedule order): the median rate, the
    median round trip, the bytes and seconds added up; an error only when no measurement got through."""
    by: Dict[Tuple[str, str], List[Link]] = {}
    for x in measured:
        by.setdefault((x.src, x.dst), []).append(x)
    out = []
    for (src, dst), runs in by.items():
        good = [x for x in runs if x.mbps is not None]
        if not good:
            out.append(runs[-1])
            continue
        rtts = [x.rtt_ms for x in good if x.rtt_ms is not None]
        out.append(Link(src, dst, round(statistics.median(x.mbps for x in good), 1), sum(x.received for x in good),
                        round(sum(x.seconds for x in good), 6), statistics.median(rtts) if rtts else None,
                        samples=tuple(x.mbps for x in good)))
    return out


def noise(links: Sequence[Link]) -> Optional[float]:
    """The median spread of the links' measurements (0.1: a link's short measurements lay within 10% of
    its median, typically); None when no link was measured twice."""
    spreads = [x.spread for x in links if x.spread is not None]
    return round(statistics.median(spreads), 3) if spreads else None


def judged(links: Sequence[Link]) -> Tuple[Tuple[Link, ...], Optional[float]]:
    """The links with the slow ones marked (under SLOW_FRACTION of the median), and that median."""
    rates = [x.mbps for x in links if x.mbps is not None]
    if not rates:
        return tuple(links), None
    median = statistics.median(rates)
    return tuple(replace(x, slow=x.mbps is not None and x.mbps < SLOW_FRACTION * median) for x in links), median


@dataclass(frozen=True)
class NetReport:
    hosts: Tuple[str, ...]
    links: Tuple[Link, ...]
    interfaces: Mapping[str, Mapping]  # host → {"bound", "ifname", "why", "mtu"} (its bandwidth's ready answer)
    unreachable: Mapping[str, str]  # host → why it could not be measured
    median_mbps: Optional[float]
    seconds: float
    rounds: int
    mb: float
    repeats: int = 1  # short measurements per link (the median kept)
    noise: Optional[float] = None  # links.noise: how much a link's measurements varied

    @property
    def slow(self) -> Tuple[Link, ...]:
        return tuple(x for x in self.links if x.slow)

    @property
    def failed(self) -> Tuple[Link, ...]:
        return tuple(x for x in self.links if x.error)

    @property
    def ok(self) -> bool:
        """Every host measured and every link too (slow links are findings, not failures)."""
        return not self.unreachable and not self.failed

    def matrix(self) -> Dict[Tuple[str, str], Link]:
        return {(x.src, x.dst): x for x in self.links}

    def to_json(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 3), "rounds": self.rounds, "mb": self.mb,
                "median_mbps": self.median_mbps, "hosts": list(self.hosts), "repeats": self.repeats,
                "noise": self.noise,
                "interfaces": {h: dict(v) for h, v in self.interfaces.items()},
                "unreachable": dict(self.unreachable), "links": [x.to_json() for x in self.links],
                "slow": [f"{x.src}→{x.dst}" for x in self.slow]}


def slow_text(link: Link, median: Optional[float]) -> str:
    """"node2 → node0: 48 Mbit/s (median of 3: 45-51), under half the median (2310 Mbit/s)"."""
    each = (f" (median of {len(link.samples)}: {rate_text(min(link.samples))}-{rate_text(max(link.samples))})"
            if len(link.samples) > 1 else "")
    return f"{link.src} → {link.dst}: {rate_text(link.mbps)}{each}, under half the median ({rate_text(median)})"


def noise_text(report: "NetReport") -> str:
    """"each link measured 3 times (median kept); they varied by 12% typically"."""
    if report.repeats < 2:
        return ""
    varied = f"; a link's measurements varied by {report.noise * 100:.0f}% typically" if report.noise is not None \
        else ""
    loud = " (a busy machine: measure again when it is quiet)" if report.noise is not None and report.noise > 0.5 \
        else ""
    return f"each link measured {report.repeats} times, the median kept{varied}{loud}"


def rtt_text(ms: Optional[float]) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1000:.0f} µs" if ms < 1 else f"{ms:.1f} ms"


def rate_text(mbps: Optional[float]) -> str:
    if mbps is None:
        return "-"
    return f"{mbps / 1000:.2f} Gbit/s" if mbps >= 1000 else f"{mbps:.0f} Mbit/s"
