"""`clusterrun ps`, `logs` and `stop`: commands on recorded runs (the CLI prints here too)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import List, Optional, Sequence

import click
from rich.table import Table
from rich.text import Text

from .cli import _complete_runs, _fail, _store, err, main
from .errors import EXIT_CONNECT, EXIT_INTERRUPTED, ClusterrunError
from .ui import console

def _connect_for(record):
    from .host_agent import make_connect
    from .inventory import Timeouts

    t = record.snapshot.get("timeouts") or {}
    return make_connect(Timeouts(**t))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-n", "--last", default=20, show_default=True, help="How many runs to list.")
@click.option("--no-reconcile", is_flag=True, help="Only read the registry; do not ask hosts.")
def ps(as_json: bool, last: int, no_reconcile: bool) -> None:
    """List runs; runs whose controller is gone are brought up to date by asking their hosts."""
    from .run_ops import reconcile

    try:
        store = _store()
        records = []
        for run_id in store.ids(limit=last):
            record = store.get(run_id)
            problems = {}
            if not no_reconcile and (not record.terminal or record.cleanup_pending):
                record, problems = reconcile(store, run_id, _connect_for(record))
            records.append((record, problems))
    except ClusterrunError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps([_record_json(r, p) for r, p in records], indent=2))
        return
    table = Table(title_justify="left")
    for col in ("run", "state", "hosts", "ranks", "started", "duration", "exit", "note"):
        table.add_column(col)
    for record, problems in records:
        ended = record.ended_at or time.time()
        note = record.reason or ""
        if record.cleanup_pending:
            note = (note + "; " if note else "") + f"stop pending on {', '.join(record.cleanup_pending)}"
        if problems:
            note = (note + "; " if note else "") + "unreachable: " + ", ".join(problems)
        table.add_row(record.id, record.state, str(len(record.hosts)), str(len(record.ranks)),
                      time.strftime("%m-%d %H:%M:%S", time.localtime(record.created_at)),
                      f"{ended - record.created_at:.0f} s", "" if record.exit_code is None else str(record.exit_code),
                      Text(note[:120]))
    console(stderr=False).print(table)


def _record_json(record, problems) -> dict:
    return {"id": record.id, "state": record.state, "exit_code": record.exit_code, "reason": record.reason,
            "created_at": record.created_at, "ended_at": record.ended_at, "inventory": record.inventory,
            "detached": record.detached, "phases": record.phases, "hosts": record.hosts, "ranks": record.ranks,
            "cleanup_pending": record.cleanup_pending, "unreachable": {k: str(v) for k, v in problems.items()}}


@main.command()
@click.argument("run", required=False, shell_complete=_complete_runs)
@click.option("-f", "--follow", is_flag=True, help="Keep following until every rank has ended.")
@click.option("--rank", "ranks", type=int, multiple=True, help="Only this rank (repeatable).")
@click.option("--tail", type=int, default=None, help="Only the last N lines of each rank first.")
def logs(run: Optional[str], follow: bool, ranks: Sequence[int], tail: Optional[int]) -> None:
    """Show (or follow) the logs of RUN (an id, a unique prefix, or `latest`), fetched from its hosts."""
    from .logs import LineSplitter, tail_lines
    from .run_ops import fetch_logs
    from .ui import LogPrinter

    try:
        store = _store()
        run_id = store.resolve(run)
        record = store.get(run_id)
        # mask the run's secrets where this shell has their values
        names = record.plan.get("secret_names", [])
        printer = LogPrinter(secrets=[os.environ[n] for n in names if n in os.environ])
        host_of = {r["rank"]: r["host"] for r in record.ranks}
        wanted = set(ranks) if ranks else set(host_of)
        unknown = wanted - set(host_of)
        if unknown:
            raise ClusterrunError(f"run {run_id} has no rank {', '.join(map(str, sorted(unknown)))}")

        def show_copies() -> None:
            for rank in sorted(wanted):
                path = store.log_path(run_id, rank)
                if tail is not None:
                    data = "".join(line + "\n" for line in tail_lines(path, tail)).encode()
                    if data:
                        printer.write(host_of[rank], rank, data)
                    continue
                splitter = LineSplitter()
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        printer.write(host_of[rank], rank, splitter.feed(chunk))
                printer.write(host_of[rank], rank, splitter.flush())

        stop_flag: List[bool] = []
        previous = signal.signal(signal.SIGINT, lambda s, f: stop_flag.append(True))
        try:
            fetch_logs(store, run_id, _connect_for(record), follow=follow, stop_flag=stop_flag,
                       on_lines=lambda ev: ev.rank in wanted and printer.write(ev.host, ev.rank, ev.data),
                       on_problem=lambda text: err.print(Text(text, style="yellow")),
                       before_follow=show_copies)
        finally:
            signal.signal(signal.SIGINT, previous)
        if not follow:
            show_copies()
        if stop_flag:
            sys.exit(EXIT_INTERRUPTED)
    except ClusterrunError as exc:
        _fail(exc)


@main.command()
@click.argument("run", required=False, shell_complete=_complete_runs)
@click.option("--grace", type=float, default=None, help="Seconds between TERM and KILL (default: the inventory's).")
def stop(run: Optional[str], grace: Optional[float]) -> None:
    """Stop every rank of RUN by its recorded process group (TERM, grace, KILL). Safe to repeat."""
    from .run_ops import stop_run

    try:
        store = _store()
        run_id = store.resolve(run)
        record = store.get(run_id)
        grace = grace if grace is not None else float((record.snapshot.get("timeouts") or {}).get("grace", 10))
        record, failures = stop_run(store, run_id, _connect_for(record), grace)
    except ClusterrunError as exc:
        _fail(exc)
        return
    for name, exc in failures.items():
        err.print(Text(f"{name}: not stopped: {exc}", style="bold red"))
    err.print(Text(f"run {run_id}: {record.state}" + (f" ({record.reason})" if record.reason else ""),
                   style="bold"))
    if failures:
        err.print(Text("run `clusterrun stop` again once those hosts are reachable", style="yellow"))
        sys.exit(EXIT_CONNECT)


