"""Looking into a recorded run while it runs, also after `--detach` or with the controller dead: every
rank's stacks (`clusterrun stacks`), gathered from its hosts in parallel; and `clusterrun top`, one open
connection per host streaming what the host samples (its CPU, memory, network, GPUs and its ranks'),
with the ranks that stand out from the others marked as stragglers."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

from .. import stacks as st
from ..config.inventory import Host
from ..errors import UsageError
from ..hosts.client import HostClient
from ..hosts.group import fan_out_background, on_hosts
from ..plan import attempt_key
from .runs import nodes_of
from .store import RunStore

Connect = Callable[[Host], HostClient]


@dataclass(frozen=True)
class StacksReport:
    run_id: str
    world: int
    ranks: Tuple[st.RankStack, ...]
    groups: Tuple[st.Group, ...]
    unreachable: Dict[str, str]  # host → why it could not be asked

    def to_json(self) -> dict:
        return st.to_json(self.run_id, self.ranks, self.groups, self.unreachable)

    @property
    def vias(self) -> Dict[str, int]:
        """How the stacks were read: {"py-spy": n, "faulthandler": m} (ranks that run)."""
        out: Dict[str, int] = {}
        for r in self.ranks:
            if r.via:
                out[r.via] = out.get(r.via, 0) + 1
        return out


def gather_stacks(store: RunStore, run_id: str, connect: Connect, ranks: Sequence[int] = (),
                  via: str = "auto") -> StacksReport:
    """Ask every host of the run's current attempt (or only those of `ranks`) for its ranks' stacks."""
    record = store.get(run_id)
    _, nodes = nodes_of(record)
    host_of = {r.rank: r.host for r in record.ranks}
    unknown = sorted(set(ranks) - set(host_of))
    if unknown:
        raise UsageError(f"run {run_id} has no rank {', '.join(map(str, unknown))} "
                         f"(it has ranks 0-{len(host_of) - 1})")
    wanted = [n for n in nodes if not ranks or n.host.name in {host_of[r] for r in ranks}]
    key = attempt_key(run_id, record.attempt)
    asked = on_hosts(wanted, connect, lambda node, client: client.stacks(key, ranks, via), thread_name="stacks")
    found = _answers(wanted, asked, ranks)
    seen = {s.rank for s in found}
    # the ranks of a host that did not answer still get their line
    found += [st.RankStack(rank, host, None, "unreachable", "", error=asked.errors[host].message)
              for rank, host in sorted(host_of.items())
              if rank not in seen and host in asked.errors and (not ranks or rank in ranks)]
    found.sort(key=lambda s: s.rank)
    return StacksReport(run_id, len(host_of), tuple(found), tuple(st.fold(found)),
                        {name: err.message for name, err in asked.failed.items()})


def _answers(nodes: Sequence, asked, ranks: Sequence[int]) -> List[st.RankStack]:
    found: List[st.RankStack] = []
    for node in nodes:
        answer = asked.results.get(node.host.name)
        if answer is not None:
            found += [s for s in st.from_host(node.host.name, answer) if not ranks or s.rank in ranks]
    return found


# -------------------------------------------------------------- top


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


def top_targets(store: RunStore, run_id: str) -> List[TopTarget]:
    """The hosts of a recorded run's current attempt."""
    record = store.get(run_id)
    _, nodes = nodes_of(record)
    key = attempt_key(run_id, record.attempt)
    return [TopTarget(n.host, key) for n in nodes]


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
