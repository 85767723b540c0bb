"""`clusterrun top`: one open connection per host streaming what the host samples (its CPU, memory, network,
GPUs and its ranks'; samples.py), with the ranks that stand out from the others marked as stragglers. Of a
recorded run's hosts while it runs (also after `--detach` or with the controller dead), or of an
inventory's hosts alone, with which clusterrun runs hold them."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..config.inventory import Host, Inventory
from ..hosts.claims import Holder
from ..hosts.client import HostClient, make_connect
from ..hosts.group import fan_out_background
from ..plan import attempt_key
from ..registry.store import RunStore
from .nodes import Connect, connect_for, nodes_of, timeouts_of
from .samples import HostLoad, RankLoad, Sample


@dataclass(frozen=True)
class TopTarget:
    """A host `top` watches: what its `samples` command is given (an attempt key, or "-": the host alone)."""

    host: Host
    target: str
    claims_dir: str = ""  # "-" only: the host's claims folder, so every user's claims come with the samples


@dataclass(frozen=True)
class HostRow:
    """A host in one refresh: its last sample's load, or why there is none."""

    name: str
    load: HostLoad
    error: str = ""
    runs: Optional[Tuple[str, ...]] = None  # the host alone ("-"): the runs its supervisors run
    claims: Optional[Tuple[Holder, ...]] = None  # ... and every user's claims and queue entries there

    def to_json(self) -> dict:
        extra = {"runs": list(self.runs or ()), "claims": [c.to_json() for c in self.claims or ()]} \
            if self.runs is not None else {}
        return {"name": self.name, **self.load.to_json(), **extra, **({"error": self.error} if self.error else {})}


@dataclass(frozen=True)
class RankRow:
    host: str
    load: RankLoad
    straggler: str = ""  # why it stands out from the others ("" when it does not)

    def to_json(self) -> dict:
        return {**self.load.to_json(), "host": self.host, "straggler": self.straggler}


@dataclass(frozen=True)
class TopView:
    """One refresh of `clusterrun top`: the last sample of every host, every rank, and who straggles."""

    run_id: str  # "" for an inventory's hosts
    hosts: Tuple[HostRow, ...]
    ranks: Tuple[RankRow, ...]

    @property
    def inventory(self) -> bool:
        """An inventory's hosts alone (their claims shown), not a run's."""
        return not self.run_id

    def to_json(self) -> dict:
        return {**({"run": self.run_id} if self.run_id else {}), "hosts": [h.to_json() for h in self.hosts],
                "ranks": [r.to_json() for r in self.ranks]}


def top_view(run_id: str, targets: Sequence[TopTarget], samples: Mapping[str, Union[Sample, str]]) -> TopView:
    """The view from each host's last sample, or why there is none (a str)."""
    hosts, ranks = [], []
    for t in targets:
        sample = samples.get(t.host.name)
        if not isinstance(sample, Sample):
            hosts.append(HostRow(t.host.name, HostLoad(), error=str(sample) if sample is not None else "no sample yet"))
            continue
        alone = t.target == "-"
        hosts.append(HostRow(t.host.name, sample.host, runs=sample.runs if alone else None,
                             claims=sample.claims if alone else None))
        ranks += [(r, t.host.name) for r in sample.ranks]
    ranks.sort(key=lambda rh: rh[0].rank)
    marks = stragglers([r for r, _ in ranks])
    return TopView(run_id, tuple(hosts), tuple(RankRow(host, r, marks.get(r.rank, "")) for r, host in ranks))


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def stragglers(ranks: Sequence[RankLoad]) -> Dict[int, str]:
    """rank → why it stands out from the other running ranks: far less (or more) CPU than their median, or
    silent far longer than they are. Needs at least 3 running ranks: with fewer there is no "the others"."""
    running = [r for r in ranks if r.running]
    out: Dict[int, str] = {}
    if len(running) < 3:
        return out
    for r in running:
        others = [o for o in running if o is not r]
        why = _cpu_odd(r, others) or _silence_odd(r, others)
        if why:
            out[r.rank] = why
    return out


def _cpu_odd(r: RankLoad, others: Sequence[RankLoad]) -> str:
    cpus = [o.cpu_pct for o in others if o.cpu_pct is not None]
    mine = r.cpu_pct
    if not cpus or mine is None:
        return ""
    typical = _median(cpus)
    if typical >= 20 and mine < typical / 3:
        return f"CPU {mine:.0f}% where the others use ~{typical:.0f}%"
    if mine >= 20 and mine > 3 * max(typical, 5):
        return f"CPU {mine:.0f}% where the others use ~{typical:.0f}%"
    return ""


def _silence_odd(r: RankLoad, others: Sequence[RankLoad]) -> str:
    quiet = [o.last_output_s for o in others if o.last_output_s is not None]
    mine = r.last_output_s
    if not quiet or mine is None:
        return ""
    typical = _median(quiet)
    if mine >= 10 and mine > 4 * (typical + 1):
        return f"silent {mine:.0f} s where the others wrote ~{typical:.0f} s ago"
    return ""


# -------------------------------------------------------------- what to watch, and watching it


@dataclass(frozen=True)
class TopWatch:
    """What `top` watches: the hosts, how to reach them, and how long a host may take beyond an interval."""

    run_id: str  # "" for an inventory's hosts
    targets: Tuple[TopTarget, ...]
    connect: Connect
    command_timeout: float

    def watch(self, *, interval: float, once: bool, on_view: Callable[[TopView], None],
              stop_flag: List[bool]) -> TopView:
        return watch_top(self.run_id, self.targets, self.connect, interval=interval, once=once, on_view=on_view,
                         stop_flag=stop_flag, command_timeout=self.command_timeout)


def top_watch(target: Optional[str], store: Callable[[], RunStore], load: Callable[[str], Inventory]) -> TopWatch:
    """`top TARGET`: an inventory file's hosts alone (loaded with `load`), else the hosts of a recorded run's
    current attempt (TARGET: an id, a unique prefix, `latest`; none: the latest), with its timeouts."""
    if target and os.path.isfile(target):
        inv = load(target)
        return TopWatch("", tuple(TopTarget(h, "-", h.claims_dir or "") for h in inv.hosts),
                        make_connect(inv.timeouts), inv.timeouts.command)
    registry = store()
    record = registry.get(registry.resolve(target))
    _, nodes = nodes_of(record)
    key = attempt_key(record.id, record.attempt)
    return TopWatch(record.id, tuple(TopTarget(n.host, key) for n in nodes), connect_for(record),
                    timeouts_of(record).command)


def watch_top(run_id: str, targets: Sequence[TopTarget], connect: Connect, *, interval: float, once: bool,
              on_view: Callable[[TopView], None], stop_flag: List[bool], command_timeout: float) -> TopView:
    """Keep one connection per host open, its `samples` streaming; hand on_view a fresh view whenever a
    sample came (at most once an interval); with once, return the first view every host has answered
    (or failed) in. Ends when stop_flag gets an element."""
    events: "queue.Queue" = queue.Queue()
    clients: Dict[str, HostClient] = {}

    def stream(t: TopTarget) -> None:
        name = t.host.name
        client = clients[name] = connect(t.host)
        samples = client.samples(t.target, interval, 1 if once else 0, t.claims_dir)
        try:
            events.put((name, Sample.from_wire(name, samples.first)))
            while not once and not stop_flag:
                events.put((name, Sample.from_wire(name, samples.next(interval + command_timeout))))
        finally:
            samples.close()

    def ended(t: TopTarget, result: object) -> None:
        if isinstance(result, Exception):
            events.put((t.host.name, f"{getattr(result, 'reason', 'error')}: {getattr(result, 'message', result)}"))

    fan_out_background(targets, stream, name=lambda t: t.host.name, on_each=ended, thread_name="top")
    latest: Dict[str, Union[Sample, str]] = {}
    try:
        return _pump(run_id, targets, events, latest, interval, once, on_view, stop_flag)
    finally:
        for client in list(clients.values()):
            client.close()


def _pump(run_id: str, targets: Sequence[TopTarget], events: "queue.Queue", latest: Dict[str, Union[Sample, str]],
          interval: float, once: bool, on_view: Callable[[TopView], None], stop_flag: List[bool]) -> TopView:
    shown = 0.0
    view = top_view(run_id, targets, latest)
    while not stop_flag:
        try:
            name, sample = events.get(timeout=0.1)
        except queue.Empty:
            continue
        latest[name] = sample  # a Sample, or why the host's stream ended
        view = top_view(run_id, targets, latest)
        if once and len(latest) == len(targets):
            return view
        if not once and time.monotonic() - shown >= min(interval, 1.0) / 2:
            on_view(view)
            shown = time.monotonic()
    return view
