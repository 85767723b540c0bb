"""`clusterrun check --net`: TCP bandwidth and round trips between the hosts, measured by the host
programs (remote/host/net/bandwidth.py) in rounds of disjoint pairs (links.py), and a heatmap of them.

Every host is connected to and its `bandwidth` started at once (one SSH channel each, held for the
whole check); then round by round, every pair of the round at once: the pair's second host serves, the
first connects, both send for at most `seconds` (or `mb` MiB), both answer. A host that cannot be
reached or started is named and its links left out; the rest is measured.
"""

from __future__ import annotations

import secrets
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..config.inventory import Host, Inventory
from ..errors import HostError
from ..hosts.bandwidth import BenchStream
from ..hosts.client import HostClient, make_connect
from ..hosts.group import fan_out
from .links import REPEATS, Link, NetReport, combined, judged, noise, pair_links, rounds

DEFAULT_MB = 32.0  # per link and direction: a quarter of a second at 1 Gbit/s
DEFAULT_SECONDS = 1.0  # per pair, at most: a slow link is measured for this long, not to the last byte
PINGS = 5


class _Bench:
    """The hosts' running `bandwidth` programs, by host name."""

    def __init__(self, inv: Inventory, connect: Callable[[Host], HostClient]):
        self.inv = inv
        self.connect = connect
        self.token = secrets.token_hex(16)
        self.clients: Dict[str, HostClient] = {}
        self.streams: Dict[str, BenchStream] = {}

    def start(self, host: Host) -> None:
        client = self.connect(host)
        self.clients[host.name] = client
        self.streams[host.name] = client.bandwidth({"token": self.token, "addr": host.master_addr,
                                                    "dest": self.inv.hosts[0].master_addr})

    def pair(self, a: str, b: str, job: dict, timeout: float) -> Tuple[Link, Link]:
        """a connects to b (which serves), both at once; both directions of the link."""
        sa, sb = self.streams[a], self.streams[b]
        pair = f"{self.token[:8]}:{a}:{b}"
        common = {**job, "pair": pair, "timeout": timeout}
        # b accepts only a's own address, a connects from it: both bound to their addr: (bandwidth.py)
        why_b = sb.start("serve", {**common, "peer": sa.ready["bound"]}, timeout)
        why_a = None if why_b else sa.start("connect", {**common, "addr": sb.ready["bound"],
                                                        "port": sb.ready["port"]}, timeout)
        at_b = {"error": why_b} if why_b else sb.result(pair, timeout + 5)
        at_a = {"error": why_a or why_b} if why_a or why_b else sa.result(pair, timeout + 5)
        return pair_links(a, b, at_a, at_b)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        for client in self.clients.values():
            client.close()


def run_net_check(inv: Inventory, *, mb: float = DEFAULT_MB, seconds: float = DEFAULT_SECONDS,
                  connect: Optional[Callable[[Host], HostClient]] = None) -> NetReport:
    """Measure every scheduled link of inv's hosts; never raises for a host's problem."""
    t0 = time.monotonic()
    bench = _Bench(inv, connect or make_connect(inv.timeouts))
    names = [h.name for h in inv.hosts]
    links: List[Link] = []
    try:
        started = fan_out(list(inv.hosts), bench.start, name=lambda h: h.name, thread_name="net")
        unreachable = {name: _why(exc) for name, exc in started.failed.items()}
        # the budget shared out over REPEATS short measurements per link: the same bytes and time in all
        total = int(mb * (1 << 20))
        timeout = seconds + inv.timeouts.connect + 5
        schedule = rounds(len(names))
        for i in range(REPEATS):
            job = {"seconds": seconds / REPEATS, "bytes": total // REPEATS + (i < total % REPEATS), "pings": PINGS}
            links += _measure(bench, schedule, names, unreachable, job, timeout)
    finally:
        bench.close()
    marked, median = judged(combined(links))
    interfaces: Mapping[str, Mapping] = {name: s.ready for name, s in bench.streams.items()}
    return NetReport(tuple(names), marked, interfaces, unreachable, median, time.monotonic() - t0, len(schedule), mb,
                     repeats=REPEATS, noise=noise(marked))


def _measure(bench: "_Bench", schedule: List[List[Tuple[int, int]]], names: List[str], unreachable: Mapping,
             job: dict, timeout: float) -> List[Link]:
    """One pass of the schedule: each round's pairs at once; both directions of every link measured."""
    links: List[Link] = []
    for pairs in schedule:
        todo = [(names[a], names[b]) for a, b in pairs if names[a] not in unreachable and names[b] not in unreachable]
        done = fan_out(todo, lambda p: bench.pair(p[0], p[1], job, timeout), name=lambda p: f"{p[0]}-{p[1]}",
                       thread_name="net-pair")
        for a, b in todo:
            links += done.results.get(f"{a}-{b}") or _failed(a, b, done.errors.get(f"{a}-{b}"))
    return links


def _why(exc: HostError) -> str:
    return f"{exc.reason}: {exc.message}"


def _failed(a: str, b: str, exc: Optional[HostError]) -> Tuple[Link, Link]:
    why = _why(exc) if exc is not None else "not measured"
    return Link(a, b, None, error=why), Link(b, a, None, error=why)


def plot(report: NetReport, path: str) -> str:
    """A heatmap of the matrix (rows: the sending host, columns: the receiving one) as PNG; matplotlib is an
    optional extra (`pip install 'clusterrun[plots]'`): ImportError without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hosts = list(report.hosts)
    cells = report.matrix()
    values = [[(cells.get((s, d)).mbps if cells.get((s, d)) and cells[(s, d)].mbps is not None else float("nan"))
               for d in hosts] for s in hosts]
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * len(hosts), 1.2 + 0.8 * len(hosts)))
    image = ax.imshow(values, cmap="viridis")
    fig.colorbar(image, ax=ax, label="Mbit/s")
    ax.set_xticks(range(len(hosts)), labels=hosts)
    ax.set_yticks(range(len(hosts)), labels=hosts)
    ax.set_xlabel("to (receives)")
    ax.set_ylabel("from (sends)")
    for (s, d), link in cells.items():
        if link.mbps is not None:
            ax.text(hosts.index(d), hosts.index(s), f"{link.mbps:.0f}" + ("\nslow" if link.slow else ""),
                    ha="center", va="center", color="white", fontsize=8, fontweight="bold" if link.slow else "normal")
    ax.set_title(f"clusterrun check --net: TCP Mbit/s, {len(hosts)} hosts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
