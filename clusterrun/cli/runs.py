"""`clusterrun ps`, `logs` and `stop`: commands on recorded runs."""

from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

import click

from ..errors import EXIT_CONNECT, EXIT_INTERRUPTED, EXIT_OK, UsageError
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
    usage = _disk_usage(registry, [r.id for r, _ in records]) if disk else None
    if as_json:
        click.echo(json.dumps([{**r.to_json(), "unreachable": {k: str(v) for k, v in p.items()},
                                **({"disk": usage.get(r.id)} if usage is not None else {})}
                               for r, p in records], indent=2))
        return EXIT_OK
    from ..ui.console import console
    from ..ui.tables import show_runs

    show_runs(records, console(stderr=False), usage)
    return EXIT_OK


def _disk_usage(registry, run_ids: Sequence[str]) -> dict:
    """run id → {bytes (files only the run links: logs, outputs), job_bytes (its links into the cache),
    hosts: {name: bytes}, removed_from: [hosts `clean` removed it from]}; asked of every host once."""
    from ..clean.run import hosts_of_runs
    from ..config.inventory import Timeouts
    from ..hosts.client import make_connect
    from ..hosts.group import fan_out

    hosts = hosts_of_runs(registry, run_ids)
    connect = make_connect(Timeouts())

    def listing(host):
        client = connect(host)
        try:
            return client.runs()
        finally:
            client.close()

    asked = fan_out(hosts, listing, key=lambda h: id(h), name=lambda h: h.name, thread_name="disk")
    wanted = set(run_ids)
    out = {run_id: {"bytes": 0, "job_bytes": 0, "hosts": {}, "removed_from": sorted(registry.cleaned(run_id))}
           for run_id in run_ids}
    for host in hosts:
        for entry in (asked.results.get(id(host)) or {}).get("runs", []):
            if entry["id"] in wanted:
                cell = out[entry["id"]]
                cell["bytes"] += entry["bytes"]
                cell["job_bytes"] += entry["job_bytes"]
                cell["hosts"][host.name] = entry["bytes"]
    return out


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

    from ..hosts.logs import LineSplitter, tail_lines
    from ..registry.runs import fetch_logs
    from ..ui.console import LogPrinter, console

    registry = store()
    run_id = registry.resolve(run)
    record = registry.get(run_id)
    # mask the run's secrets where this shell has their values
    names = record.plan.get("secret_names", [])
    printer = LogPrinter(secrets=[os.environ[n] for n in names if n in os.environ])
    attempt = record.attempt if attempt_no is None else attempt_no - 1
    if not 0 <= attempt <= record.attempt:
        raise UsageError(f"run {run_id} has attempt{'s 1-' if record.attempt else ' '}{record.attempt + 1} only "
                         f"(--attempt {attempt_no})")
    past = [a for a in record.attempts if a.attempt == attempt]
    host_of = {r.rank: r.host for r in (past[0].ranks if past else record.ranks)}
    follow = follow and not past  # an attempt before the last one has ended
    wanted = set(ranks) if ranks else set(host_of)
    unknown = wanted - set(host_of)
    if unknown:
        raise UsageError(f"run {run_id} has no rank {', '.join(map(str, sorted(unknown)))} "
                         f"(it has ranks 0-{len(host_of) - 1})")
    err = console(stderr=True)
    if record.attempt:
        err.print(Text(f"attempt {attempt + 1} of {record.attempt + 1}"
                       + ("" if attempt_no else " (--attempt N for another)"), style="dim"))

    def show(path: str, host: str, rank: Optional[int], stream: str = "") -> None:
        if not os.path.exists(path):
            return
        if tail is not None:
            data = "".join(line + "\n" for line in tail_lines(path, tail)).encode()
            if data:
                printer.write(host, rank, data, stream)
            return
        splitter = LineSplitter()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                printer.write(host, rank, splitter.feed(chunk), stream)
        printer.write(host, rank, splitter.flush(), stream)

    def show_copies() -> None:
        if not ranks:  # each host's other output first: its setup, torchrun's own messages
            for h in record.hosts:
                if attempt == 0:
                    show(registry.aux_log_path(run_id, h.name, "setup"), h.name, None, "setup")
                show(registry.aux_log_path(run_id, h.name, "torchrun", attempt), h.name, None, "torchrun")
        for rank in sorted(wanted):
            show(registry.log_path(run_id, rank, attempt), host_of[rank], rank)

    stop_flag: List[bool] = []
    with forward_signals(lambda: stop_flag.append(True)):
        fetch_logs(registry, run_id, connect_for(record), follow=follow, stop_flag=stop_flag,
                   on_lines=lambda ev: ev.rank in wanted and printer.write(ev.host, ev.rank, ev.data),
                   on_problem=lambda text: err.print(Text(text, style="yellow")),
                   before_follow=show_copies, attempt=attempt)
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
