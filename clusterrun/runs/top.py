"""`clusterrun top`: one open connection per host streaming what the host samples (its CPU, memory, network,
GPUs and its ranks'), with the ranks that stand out from the others marked as stragglers. Of a recorded
run's hosts while it runs (also after `--detach` or with the controller dead), or of an inventory's hosts
alone, with which clusterrun runs hold them."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..config.inventory import Host, Inventory
from ..hosts.client import HostClient, make_connect
from ..hosts.group import fan_out_background
from ..plan import attempt_key
from ..registry.store import RunStore
from .nodes import Connect, connect_for, nodes_of, timeouts_of


@dataclass(frozen=True)
class TopTarget:
    """A host `top` watches: what its `samples` command is given (an attempt key, or "-": the host alone)."""

    host: Host
    target: str
    claims_dir: str = ""  # "-" only: the host's claims folder, so every user's claims come with the samples


@dataclass(frozen=True)
class TopView:
    """One refresh of `clusterrun top`: the last sample of every host, every rank, and who straggles."""

    run_id: str  # "" for an inventory's hosts
    hosts: Tuple[dict, ...]  # {"name", "cpu_pct", "cores", "load1", "mem_used", "mem_total", "net_rx", "net_tx",
    #                            "gpus", "runs"?, "claims"?, "error"?}
    ranks: Tuple[dict, ...]  # {"rank", "host", "state", "cpu_pct", "rss", "rss_children", "children",
    #                            "last_output_s", "straggler"}

    def to_json(self) -> dict:
        return {**({"run": self.run_id} if self.run_id else {}), "hosts": list(self.hosts), "ranks": list(self.ranks)}


HOST_FIELDS = ("cpu_pct", "cores", "load1", "mem_used", "mem_total", "net_rx", "net_tx", "gpus")


def top_view(run_id: str, targets: Sequence[TopTarget], samples: Dict[str, object]) -> TopView:
    """The view from each host's last sample (a dict) or why there is none (a str)."""
    hosts, ranks = [], []
    for t in targets:
        sample = samples.get(t.host.name)
        if not isinstance(sample, dict):
            hosts.append({"name": t.host.name, **{k: None for k in HOST_FIELDS},
                          "error": str(sample) if sample is not None else "no sample yet"})
            continue
        h = sample.get("host") or {}
        hosts.append({"name": t.host.name, **{k: h.get(k) for k in HOST_FIELDS},
                      **({"runs": sample.get("runs") or [], "claims": sample.get("claims") or []}
                         if t.target == "-" else {})})
        ranks += [{**r, "host": t.host.name} for r in sample.get("ranks") or () if isinstance(r, dict)]
    ranks.sort(key=lambda r: r.get("rank", 0))
    marks = stragglers(ranks)
    return TopView(run_id, tuple(hosts), tuple({**r, "straggler": marks.get(r.get("rank"), "")} for r in ranks))


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def stragglers(ranks: Sequence[dict]) -> Dict[int, str]:
    """rank → why it stands out from the other running ranks: far less (or more) CPU than their median, or
    silent far longer than they are. Needs at least 3 running ranks: with fewer there is no "the others"."""
    running = [r for r in ranks if r.get("state") == "running"]
    out: Dict[int, str] = {}
    if len(running) < 3:
        return out
    for r in running:
        others = [o for o in running if o is not r]
        why = _cpu_odd(r, others) or _silence_odd(r, others)
        if why:
            out[r["rank"]] = why
    return out


def _cpu_odd(r: dict, others: Sequence[dict]) -> str:
    cpus = [o["cpu_pct"] for o in others if isinstance(o.get("cpu_pct"), (int, float))]
    mine = r.get("cpu_pct")
    if not cpus or not isinstance(mine, (int, float)):
        return ""
    typical = _median(cpus)
    if typical >= 20 and mine < typical / 3:
        return f"CPU {mine:.0f}% where the others use ~{typical:.0f}%"
    if mine >= 20 and mine > 3 * max(typical, 5):
        return f"CPU {mine:.0f}% where the others use ~{typical:.0f}%"
    return ""


def _silence_odd(r: dict, others: Sequence[dict]) -> str:
    quiet = [o["last_output_s"] for o in others if isinstance(o.get("last_output_s"), (int, float))]
    mine = r.get("last_output_s")
    if not quiet or not isinstance(mine, (int, float)):
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
        client = clients[t.host.name] = connect(t.host)
        samples = client.samples(t.target, interval, 1 if once else 0, t.claims_dir)
        try:
            events.put((t.host.name, samples.first))
            while not once and not stop_flag:
                events.put((t.host.name, samples.next(interval + command_timeout)))
        finally:
            samples.close()

    def ended(t: TopTarget, result: object) -> None:
        if isinstance(result, Exception):
            events.put((t.host.name, f"{getattr(result, 'reason', 'error')}: {getattr(result, 'message', result)}"))

    fan_out_background(targets, stream, name=lambda t: t.host.name, on_each=ended, thread_name="top")
    latest: Dict[str, object] = {}
    try:
        return _pump(run_id, targets, events, latest, interval, once, on_view, stop_flag)
    finally:
        for client in list(clients.values()):
            client.close()


def _pump(run_id: str, targets: Sequence[TopTarget], events: "queue.Queue", latest: Dict[str, object],
          interval: float, once: bool, on_view: Callable[[TopView], None], stop_flag: List[bool]) -> TopView:
    shown = 0.0
    view = top_view(run_id, targets, latest)
    while not stop_flag:
        try:
            name, sample = events.get(timeout=0.1)
        except queue.Empty:
            continue
        latest[name] = sample  # a dict, or why the host's stream ended
        view = top_view(run_id, targets, latest)
        if once and len(latest) == len(targets):
            return view
        if not once and time.monotonic() - shown >= min(interval, 1.0) / 2:
            on_view(view)
            shown = time.monotonic()
    return view
