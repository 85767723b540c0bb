"""`clusterrun check` on a terminal: one row per host, one column per check, then what to fix.

Cells are short (a status mark and a few words) so the table fits; where even that is wider than the
terminal, a line per host names its checks that are not ok, with the host's name whole. The full detail
and the hint of every cell that is not plainly ok follow. How each host was reached over SSH (a long
line per host) is shown for a host whose ssh check did not pass, or for every host with -v. Host text is
never parsed as markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..check.rules import CHECKS, FAIL, OK, SKIP, WARN, Report

if TYPE_CHECKING:
    from ..check.links import NetReport

MARK = {OK: "✓", WARN: "!", FAIL: "✗", SKIP: "·"}
STYLE = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def cell(status: str, short: str) -> Text:
    if status == SKIP:
        return Text(MARK[status], style=STYLE[status])
    return Text(f"{MARK[status]} {short or status}", style=STYLE[status])


def table(report: Report) -> Table:
    """Hosts x checks, a short cell each."""
    out = Table(title=_title(report), title_justify="left")
    out.add_column("host", no_wrap=True)
    for name in CHECKS:
        out.add_column(name, no_wrap=True)
    for h in report.hosts:
        row = [Text(h.host, style="bold" if h.ok else "bold red")]
        for name in CHECKS:
            r = h.get(name)
            row.append(cell(r.status, r.short) if r else Text(""))
        out.add_row(*row)
    return out


def _title(report: Report) -> str:
    port = report.master_port if report.master_port is not None else "auto"
    return (f"clusterrun check · MASTER_ADDR={report.master_addr} MASTER_PORT={port} · "
            f"{len(report.hosts)} hosts in {report.seconds:.1f} s")


def by_host(report: Report) -> list:
    """For a terminal narrower than the table: a line per host, its name whole, the checks that are not ok
    by name and the tally of the rest."""
    width = max(len(h.host) for h in report.hosts) if report.hosts else 0
    lines = []
    for h in report.hosts:
        line = Text.assemble((h.host.ljust(width), "bold" if h.ok else "bold red"), "  ")
        odd = [r for r in h.results if r.status in (WARN, FAIL)]
        for r in odd:
            line.append(f"{MARK[r.status]} {r.name} {r.short or r.status}", style=STYLE[r.status])
            line.append("  ")
        ok = sum(r.status == OK for r in h.results)
        skipped = [r.name for r in h.results if r.status == SKIP]
        tally = f"{MARK[OK]} {ok} ok" + (f", skipped: {' '.join(skipped)}" if skipped else "")
        line.append(tally, style=STYLE[OK] if not odd else "")
        lines.append(line)
    return lines


def render_checks(report: Report, console: Console, verbose: bool = False) -> None:
    full = table(report)
    natural = full.__rich_measure__(console, console.options.update_width(1 << 16)).maximum
    if natural <= console.width:
        console.print(full)
    else:
        port = report.master_port if report.master_port is not None else "auto"
        console.print(Text(f"clusterrun check · {len(report.hosts)} hosts in {report.seconds:.1f} s", style="italic"))
        console.print(Text(f"MASTER_ADDR={report.master_addr} MASTER_PORT={port}", style="italic"))
        for line in by_host(report):
            console.print(line)
    _routes(report, console, verbose)
    _findings(report, console)
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    _verdict(report, console)


def _routes(report: Report, console: Console, verbose: bool) -> None:
    """How each host was reached over SSH (where each value came from): for a host whose ssh check did not
    pass, or for every host with -v."""
    for h in report.hosts:
        ssh = h.get("ssh")
        route = (ssh.data or {}).get("route") if ssh else ""
        if route and (verbose or ssh.status != OK):
            console.print(Text.assemble((h.host, "bold"), " ssh ", (route, "dim")))


def _findings(report: Report, console: Console) -> None:
    """The full detail and the hint of every cell that is not plainly ok."""
    for h in report.hosts:
        for r in h.results:
            if r.status in (WARN, FAIL) or (r.status == OK and r.hint):
                console.print(Text.assemble((h.host, "bold"), " ", (r.name, "bold"), " ",
                                            (r.status.upper(), STYLE[r.status]), ": ", r.detail))
                if r.hint:
                    console.print(Text(f"    hint: {r.hint}", style="dim"))


def _verdict(report: Report, console: Console) -> None:
    failed = [h.host for h in report.hosts if not h.ok]
    if failed:
        console.print(Text(f"{len(failed)} of {len(report.hosts)} hosts failed: {', '.join(failed)}",
                           style=STYLE[FAIL]))
    else:
        warned = [h.host for h in report.hosts if any(r.status == WARN for r in h.results)]
        console.print(Text(f"all {len(report.hosts)} hosts pass" +
                           (f" (warnings on {', '.join(warned)})" if warned else ""), style=STYLE[OK]))


def net_table(report: "NetReport") -> Table:
    """`check --net`: the sending host by row, the receiving one by column; each cell its rate and the
    pair's round trip, slow links marked."""
    from ..check.links import rate_text, rtt_text

    out = Table(title=f"clusterrun check --net · TCP, {report.mb:g} MiB or 1 s per link each way · "
                      f"{len(report.hosts)} hosts, {report.rounds} rounds in {report.seconds:.1f} s",
                title_justify="left")
    out.add_column("from \\ to", no_wrap=True)
    for name in report.hosts:
        out.add_column(name, no_wrap=True)
    out.add_column("interface", no_wrap=True)
    cells = report.matrix()
    for src in report.hosts:
        row = [Text(src, style="bold")]
        for dst in report.hosts:
            link = cells.get((src, dst))
            if src == dst or link is None:
                row.append(Text("·", style=STYLE[SKIP]))
            elif link.error:
                row.append(Text("✗ failed", style=STYLE[FAIL]))
            else:
                rtt = f" {rtt_text(link.rtt_ms)}" if link.rtt_ms is not None else ""
                row.append(Text(f"{'! ' if link.slow else ''}{rate_text(link.mbps)}{rtt}",
                                style=STYLE[WARN] if link.slow else ""))
        ready = report.interfaces.get(src) or {}
        row.append(Text(f"{ready.get('ifname') or '?'} ({ready.get('bound', '?')})" if ready else
                        "unreachable", style="" if ready else STYLE[FAIL]))
        out.add_row(*row)
    return out


def render_net(report: "NetReport", console: Console, plotted: Optional[str] = None) -> None:
    from ..check.links import noise_text, rate_text, slow_text

    console.print(net_table(report))
    for host, why in report.unreachable.items():
        console.print(Text.assemble((host, "bold"), " ", ("FAIL", STYLE[FAIL]), f": not measured: {why}"))
    for link in report.failed:
        console.print(Text.assemble((f"{link.src} → {link.dst}", "bold"), " ", ("FAIL", STYLE[FAIL]), f": {link.error}"))
    for link in report.slow:
        console.print(Text.assemble(("slow ", STYLE[WARN]), slow_text(link, report.median_mbps)))
    if report.slow:
        console.print(Text("    hint: a link much slower than the others holds every collective back: check that "
                           "host's NIC, cable, switch port and traffic shaping (tc)", style="dim"))
    if plotted:
        console.print(Text(f"heatmap: {plotted}", style="dim"))
    if noise_text(report):
        console.print(Text(noise_text(report), style="dim"))
    measured = [x for x in report.links if x.mbps is not None]
    verdict = f"{len(measured)} of {len(report.links)} directions measured, median {rate_text(report.median_mbps)}"
    console.print(Text(verdict + (f"; {len(report.slow)} slow" if report.slow else ""),
                       style=STYLE[OK] if report.ok and not report.slow else STYLE[WARN] if report.ok else STYLE[FAIL]))
