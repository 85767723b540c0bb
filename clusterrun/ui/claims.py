"""Every rendering of a claim or queue entry on a shared host (hosts.claims.Holder, the one record of it):
the table of who holds what (`ps --hosts`, a busy launch), a waiting launch's line, and `top`'s cell of a
host's runs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .tables import host_ranges

if TYPE_CHECKING:
    from ..hosts.claims import Holder


def _clock(t: float) -> str:
    if not t:
        return "-"
    fmt = "%H:%M:%S" if time.time() - t < 20 * 3600 else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def claims_table(entries: Sequence["Holder"], title: str) -> Table:
    """Who holds or waits for what, one row per claim or queue entry: host, user, run, state, since, from
    which machine, slots, GPUs."""
    table = Table(title=title, title_justify="left")
    for col in ("host", "user", "run", "state", "since", "from", "slots", "GPUs"):
        table.add_column(col)
    for e in entries:
        state = f"waiting #{e.position}" if e.kind == "queue" and e.position else (
            "waiting" if e.kind == "queue" else e.state)
        if not e.live:
            state += " (stale)"
        table.add_row(e.host, e.user, e.run, state, _clock(e.since), e.by or "-", str(e.slots), e.gpu_text())
    return table


def show_busy(exc, out: Console) -> None:
    """launch's exit 5: the table of what holds (or waits ahead for) each busy host, then the one line."""
    entries = [h for err in exc.failures.values() for h in getattr(err, "holders", ()) + getattr(err, "ahead", ())]
    if entries:
        out.print(claims_table(entries, "hosts busy: held by other runs (or others ahead in line)"))
    head = str(exc).splitlines()[0]
    out.print(Text(f"clusterrun: {head}", style="bold red"))
    for line in str(exc).splitlines()[1:]:
        out.print(Text(line, style="red" if not line.lstrip().startswith("(") else "dim"))


def show_host_claims(listing, out: Console) -> None:
    """`ps --hosts`: every claim and queue entry on the inventory's hosts, any user's; hosts not asked."""
    hosts = [listing.results[name] for name in listing.names if name in listing.results]  # inventory order
    entries = [e for hc in hosts for e in hc.entries]
    free = [hc.host for hc in hosts if not any(e.live for e in hc.entries)]
    asked = f"{len(listing.results)} host{'s' if len(listing.results) != 1 else ''}"
    if entries:
        out.print(claims_table(entries, f"claims on {asked}"))
    elif listing.results:
        out.print(Text(f"no claims and nobody waiting on {asked}"))
    if free:
        out.print(Text(f"free: {host_ranges(free)}", style="dim"))
    for name, err in listing.failed.items():
        out.print(Text(f"{name}: not asked: {err}", style="yellow"))


def wait_line(status) -> str:
    """A waiting launch's place on its hosts in one line, hosts that stand alike folded (node[0-3])."""
    parts: Dict[str, list] = {}
    for h in status.hosts:
        if h.ready:
            text = "free"
        elif h.holders:
            text = "held by " + ", ".join(f"{e.user}'s {e.run} ({e.state} since {_clock(e.since)}, from {e.by or '?'})"
                                          for e in h.holders)
        else:
            text = f"#{h.position} in line, behind " + ", ".join(f"{e.user}'s {e.run}" for e in h.ahead)
        parts.setdefault(text, []).append(h.host)
    return f"waiting ({status.waited:.0f} s): " + "; ".join(f"{host_ranges(n)}: {t}" for t, n in parts.items())


def runs_cell(claims: Sequence["Holder"], runs: Sequence[str]) -> str:
    """A host's runs in `top`'s inventory view: every user's claims (`alice: 2026…-ab12 2 slots, GPUs 0,1`),
    who waits (`bob waits #1: 2026…-cd34`), and this user's runs without a claim (claims off)."""
    waiting = sorted((c for c in claims if c.kind == "queue"), key=lambda c: c.ticket)
    parts = [_held(c) for c in claims if c.kind != "queue"]
    parts += [f"{c.user} waits #{n}: {c.run}" for n, c in enumerate(waiting, 1)]
    claimed = {c.run for c in claims}
    parts += [r for r in runs if r.split("/")[0] not in claimed]
    return "\n".join(parts) or "-"


def _held(c: "Holder") -> str:
    gpu = f", GPUs {c.gpu_text()}" if isinstance(c.gpus, tuple) and c.gpus else ""
    return f"{c.user}: {c.run} {c.slots} slot{'s' if c.slots != 1 else ''}{gpu}"
