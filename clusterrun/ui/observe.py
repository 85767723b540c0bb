"""What `clusterrun stacks` and `clusterrun top` print."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from rich.console import Console
from rich.text import Text

from .. import stacks as st

if TYPE_CHECKING:
    from ..runs.samples import GpuLoad
    from ..runs.top import TopView

VIA_WORDS = {"py-spy": "py-spy", "faulthandler": "faulthandler (clusterrun's bootstrap)"}


def show_stacks(report, out: Console, detail: bool = False) -> None:
    """The folded stacks, the smallest group first (its first line names the odd rank); with detail
    (`--rank`), every thread and child process of each rank in full."""
    for group in report.groups:
        out.print(Text(st.headline(group, report.world), style="bold"))
        members = [r for r in report.ranks if r.rank in group.ranks]
        _frames(out, group.frames, "    ")
        if detail:
            for r in members:
                _rank_detail(out, r)
        else:
            _others(out, members)
    for name, why in report.unreachable.items():
        out.print(Text(f"{name}: not asked: {why}", style="yellow"))
    out.print(Text(_vias(report), style="dim"))


def _frames(out: Console, frames: Sequence[st.Frame], indent: str) -> None:
    width = max((len(f.function) for f in frames), default=0)
    for f in frames:
        out.print(Text(f"{indent}{f.function.ljust(width)}  {st.short_path(f.file)}:{f.line}"))


def _others(out: Console, members: Sequence[st.RankStack]) -> None:
    """The group's other threads and child processes, identical ones folded, one line each."""
    lines: Dict[Tuple[str, str], List[int]] = {}
    for r in members:
        for t in r.threads:
            if not t.main:
                lines.setdefault(("thread", st.where(t.frames)), []).append(r.rank)
        for c in r.children:
            what = st.where(next((t.frames for t in c.threads if t.main), ())) if c.threads else \
                f"{st.NO_STACK}: {c.error}" if c.error else st.NO_STACK
            lines.setdefault((f"child process ({c.name or '?'})", what), []).append(r.rank)
    for (kind, what), ranks in lines.items():
        count = f"{len(ranks)}× " if len(ranks) > 1 else ""
        out.print(Text(f"  + {count}{kind} of {st.ranks_label(sorted(set(ranks)))}: {what}", style="dim"))


def _rank_detail(out: Console, r: st.RankStack) -> None:
    out.print(Text(f"  rank {r.rank} on {r.host}, pid {r.pid}" + (f", read by {r.via}" if r.via else "")
                   + (f": {r.error}" if r.error else ""), style="dim"))
    for t in r.threads:
        out.print(Text(f"  thread {t.name}" + (" (main)" if t.main else "") + ":"))
        _frames(out, t.frames, "    ")
    for c in r.children:
        out.print(Text(f"  child process {c.pid} ({c.name or '?'})" + (f", read by {c.via}" if c.via else "")
                       + (f": {c.error}" if c.error else "") + ":"))
        for t in c.threads:
            out.print(Text(f"    thread {t.name}" + (" (main)" if t.main else "") + ":"))
            _frames(out, t.frames, "      ")


def _vias(report) -> str:
    by: Dict[str, List[int]] = {}
    for r in report.ranks:
        if r.state == "running":
            by.setdefault(r.via or "", []).append(r.rank)
    parts = [f"{VIA_WORDS.get(via, via) or 'could not be read'}: {st.ranks_label(ranks)}" for via, ranks in by.items()]
    return "stacks read by " + ("; ".join(parts) if parts else "nothing (no rank runs)")


def _size(n) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}B"


def _num(v, fmt: str, suffix: str = "") -> str:
    return format(v, fmt) + suffix if isinstance(v, (int, float)) else "-"


def _gpus(gpus: Optional[Sequence["GpuLoad"]]) -> str:
    if not gpus:
        return "·"
    return " ".join(f"{_num(g.util_pct, '.0f', '%')} {_size(g.mem_used)}/{_size(g.mem_total)}" for g in gpus)


def top_renderable(view: "TopView"):
    """The hosts table and the ranks table of one refresh."""
    from rich.console import Group

    parts = [_hosts_table(view)]
    if view.ranks:
        parts.append(_ranks_table(view))
    return Group(*parts)


def _hosts_table(view: "TopView"):
    from rich.table import Table

    from .claims import runs_cell

    hosts = Table(title=f"run {view.run_id}" if view.run_id else "hosts", title_justify="left")
    for col in ("host", "CPU", "load", "memory", "net rx/tx MB/s", "GPUs (util, memory)") + \
            (("clusterrun runs (claims, waiting)",) if view.inventory else ()):
        hosts.add_column(col)
    for h in view.hosts:
        runs = [runs_cell(h.claims or (), h.runs or ())] if view.inventory else []
        if h.error:
            hosts.add_row(h.name, Text(h.error[:100], style="red"), "", "", "", "", *runs)
            continue
        load = h.load
        net = f"{_num(_mb(load.net_rx), '.1f')}/{_num(_mb(load.net_tx), '.1f')}"
        hosts.add_row(h.name, _num(load.cpu_pct, ".0f", "%"), _num(load.load1, ".2f"),
                      f"{_size(load.mem_used)}/{_size(load.mem_total)}", net, _gpus(load.gpus), *runs)
    return hosts


def _ranks_table(view: "TopView"):
    from rich.table import Table

    ranks = Table(title_justify="left")
    stragglers = any(row.straggler for row in view.ranks)
    for col in ("rank", "host", "state", "CPU", "RSS", "silent") + (("straggler",) if stragglers else ()):
        ranks.add_column(col)
    for row in view.ranks:
        r = row.load
        kids = f" +{r.children} ({_size(r.rss_children)})" if r.children else ""
        # an ended rank is not silent: it has nothing more to say
        silent = _num(r.last_output_s, ".0f", " s") if r.state == "running" else "-"
        cells = [str(r.rank), row.host, r.state, _num(r.cpu_pct, ".0f", "%"), _size(r.rss) + kids, silent]
        ranks.add_row(*cells, *([Text(row.straggler or "", style="bold yellow")] if stragglers else []))
    return ranks


def _mb(v: Optional[float]) -> Optional[float]:
    return v / 1e6 if v is not None else None


def show_top(view: "TopView", out: Console) -> None:
    out.print(top_renderable(view))
