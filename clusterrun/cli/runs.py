"""`clusterrun ps`, `logs` and `stop`: commands on recorded runs."""

from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

import click

from ..errors import EXIT_CONNECT, EXIT_INTERRUPTED, EXIT_OK
from .common import connect_for, forward_signals, store


def _complete_runs(ctx, param, incomplete):
    try:
        return [i for i in store().ids(limit=50) if i.startswith(incomplete)] + \
            (["latest"] if "latest".startswith(incomplete) else [])
    except Exception:  # completion must never crash the shell
        return []


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-n", "--last", default=20, show_default=True, help="How many runs to list.")
@click.option("--no-reconcile", is_flag=True, help="Only read the registry; do not ask hosts.")
@click.option("--disk", is_flag=True, help="Also the bytes each run keeps on its hosts (logs, outputs).")
def ps(as_json: bool, last: int, no_reconcile: bool, disk: bool) -> int:
    """List runs; runs whose controller is gone are brought up to date by asking their hosts."""
    registry = store()
    records = []
    for run_id in registry.ids(limit=last):
        record = registry.get(run_id)
        problems = {}
        if not no_reconcile and (not record.terminal or record.cleanup_pending):
            from ..registry.runs import reconcile  # only where a host must be asked: SSH is a heavy import

            record, problems = reconcile(registry, run_id, connect_for(record))
        records.append((record, problems))
    usage = None
    if disk:
        from ..clean.apply import disk_usage
        from ..config.inventory import Timeouts
        from ..hosts.client import make_connect

        usage = disk_usage(registry, [r.id for r, _ in records], make_connect(Timeouts()))
    if as_json:
        click.echo(json.dumps([{**r.to_json(), "unreachable": {k: str(v) for k, v in p.items()},
                                **({"disk": usage.get(r.id)} if usage is not None else {})}
                               for r, p in records], indent=2))
        return EXIT_OK
    from ..ui.console import console
    from ..ui.tables import show_runs

    show_runs(records, console(stderr=False), usage)
    return EXIT_OK


@click.command()
@click.argument("run", required=False, shell_complete=_complete_runs)
@click.option("-f", "--follow", is_flag=True, help="Keep following until every rank has ended.")
@click.option("--rank", "ranks", type=int, multiple=True, help="Only this rank (repeatable).")
@click.option("--tail", type=int, default=None, help="Only the last N lines of each rank first.")
@click.option("--attempt", "attempt_no", type=int, default=None,
              help="A run that restarted (job.restarts): the logs of attempt N (1 = the first; default: the last).")
def logs(run: Optional[str], follow: bool, ranks: Sequence[int], tail: Optional[int],
         attempt_no: Optional[int]) -> int:
    """Show (or follow) the logs of RUN (an id, a unique prefix, or `latest`), fetched from its hosts."""
    from rich.text import Text

    from ..registry.runs import fetch_logs, replay_copies, select_logs
    from ..ui.console import LogPrinter, console

    registry = store()
    run_id = registry.resolve(run)
    record = registry.get(run_id)
    # mask the run's secrets where this shell has their values
    names = record.plan.get("secret_names", [])
    printer = LogPrinter(secrets=[os.environ[n] for n in names if n in os.environ])
    sel = select_logs(record, attempt_no, ranks)
    follow = follow and sel.followable  # an attempt before the last one has ended
    err = console(stderr=True)
    if sel.attempts > 1:
        err.print(Text(f"attempt {sel.attempt + 1} of {sel.attempts}"
                       + ("" if attempt_no else " (--attempt N for another)"), style="dim"))

    def show_copies() -> None:
        for ev in replay_copies(registry, record, sel, tail=tail, aux=not ranks):
            printer.write(ev.host, None if ev.rank < 0 else ev.rank, ev.data, ev.stream)

    wanted = set(sel.ranks)
    stop_flag: List[bool] = []
    with forward_signals(lambda: stop_flag.append(True)):
        fetch_logs(registry, run_id, connect_for(record), follow=follow, stop_flag=stop_flag,
                   on_lines=lambda ev: ev.rank in wanted and printer.write(ev.host, ev.rank, ev.data),
                   on_problem=lambda text: err.print(Text(text, style="yellow")),
                   before_follow=show_copies, attempt=sel.attempt)
    if not follow:
        show_copies()
    return EXIT_INTERRUPTED if stop_flag else EXIT_OK


@click.command()
@click.argument("run", required=False, shell_complete=_complete_runs)
@click.option("--grace", type=float, default=None, help="Seconds between TERM and KILL (default: the inventory's).")
def stop(run: Optional[str], grace: Optional[float]) -> int:
    """Stop every rank of RUN by its recorded process group (TERM, grace, KILL). Safe to repeat."""
    from rich.text import Text

    from ..registry.runs import stop_run
    from ..ui.console import console

    registry = store()
    run_id = registry.resolve(run)
    record = registry.get(run_id)
    grace = grace if grace is not None else float((record.snapshot.get("timeouts") or {}).get("grace", 10))
    record, failures = stop_run(registry, run_id, connect_for(record), grace)
    err = console(stderr=True)
    for name, exc in failures.items():
        err.print(Text(f"{name}: not stopped: {exc}", style="bold red"))
    err.print(Text(f"run {run_id}: {record.state.value}" + (f" ({record.reason})" if record.reason else ""),
                   style="bold"))
    if failures:
        err.print(Text("run `clusterrun stop` again once those hosts are reachable", style="yellow"))
        return EXIT_CONNECT
    return EXIT_OK
