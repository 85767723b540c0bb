"""`clusterrun ps`, `logs` and `stop`: commands on recorded runs."""

from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

import click

from ..errors import EXIT_CONNECT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
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
@click.option("--hosts", "hosts_of", metavar="INVENTORY", type=click.Path(dir_okay=False),
              help="Instead: every claim and queue entry on INVENTORY's hosts, any user's (who holds what, who waits).")
def ps(as_json: bool, last: int, no_reconcile: bool, disk: bool, hosts_of: Optional[str]) -> int:
    """List runs; runs whose controller is gone are brought up to date by asking their hosts."""
    if hosts_of:
        return _host_claims(hosts_of, as_json)
    from ..runs.ps import listed_runs

    registry = store()
    records = listed_runs(registry, last, connect_for, ask_hosts=not no_reconcile)
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


def _host_claims(inventory: str, as_json: bool) -> int:
    """`ps --hosts INVENTORY`: each host's claims folder, listed there (any user's entries)."""
    from ..hosts.claims import list_claims
    from ..hosts.client import make_connect
    from .common import load

    from ..clean.leftovers import leftovers

    inv = load(inventory)
    listing = list_claims(inv.hosts, make_connect(inv.timeouts))
    # the processes that hold GPU devices where runs use GPUs (docs/gpus.md): each labelled, only listed
    held, _ = leftovers([h for h in inv.hosts if h.gpus is not None], make_connect(inv.timeouts))
    if as_json:
        click.echo(json.dumps({"hosts": {name: listing.results[name].to_json() for name in listing.names
                                         if name in listing.results},
                               "gpu_holders": [x.to_json() for x in held],
                               "unreachable": {name: str(e) for name, e in listing.failed.items()}}, indent=2))
    else:
        from ..ui.console import console
        from ..ui.claims import show_host_claims
        from ..ui.tables import show_gpu_holders

        show_host_claims(listing, console(stderr=False))
        show_gpu_holders(held, console(stderr=False))
    return EXIT_CONNECT if listing.failed else EXIT_OK


@click.command()
@click.argument("run", required=False, shell_complete=_complete_runs)
@click.option("-f", "--follow", is_flag=True,
              help="Keep following until every rank has ended; then the run's summary, and its exit code.")
@click.option("--rank", "ranks", type=int, multiple=True, help="Only this rank (repeatable).")
@click.option("--tail", type=click.IntRange(min=0), default=None, help="Only the last N lines of each rank first.")
@click.option("--attempt", "attempt_no", type=int, default=None,
              help="A run that restarted (job.restarts): the logs of attempt N (1 = the first; default: the last).")
@click.option("--fold", is_flag=True, help="The same line from many ranks shown once, with their set "
                                           "([node[0-7] r*]); the ranks' logs side by side.")
def logs(run: Optional[str], follow: bool, ranks: Sequence[int], tail: Optional[int],
         attempt_no: Optional[int], fold: bool) -> int:
    """Show (or follow) the logs of RUN (an id, a unique prefix, or `latest`), fetched from its hosts.

    With -f, the exit code is the run's (0 succeeded, 1 failed, 4 time limit, 130 interrupted).
    """
    from rich.text import Text

    from ..runs.logs import fetch_logs, select_logs
    from ..states import RunState
    from ..ui.console import console, log_printer

    registry = store()
    run_id = registry.resolve(run)
    record = registry.get(run_id)
    # mask the run's secrets where this shell has their values
    names = record.plan.get("secret_names", [])
    secrets = [os.environ[n] for n in names if n in os.environ]
    sel = select_logs(record, attempt_no, ranks)
    printer = log_printer(secrets, fold, len(sel.host_of))
    follow = follow and sel.followable  # an attempt before the last one has ended
    err = console(stderr=True)
    if sel.attempts > 1:
        err.print(Text(f"attempt {sel.attempt + 1} of {sel.attempts}"
                       + ("" if attempt_no else " (--attempt N for another)"), style="dim"))

    def show_copies() -> None:
        _show_copies(registry, record, sel, tail, not ranks, secrets, fold)

    wanted = set(sel.ranks)
    stop_flag: List[bool] = []
    if follow and record.state is RunState.WAITING:  # --detach --wait: in line on its hosts
        record, code = _await_turn(registry, record, err, secrets)
        if code is not None:
            return code
        sel = select_logs(record, attempt_no, ranks)
    with forward_signals(lambda: stop_flag.append(True)):
        fetch_logs(registry, run_id, connect_for(record), follow=follow, stop_flag=stop_flag,
                   on_lines=lambda ev: ev.rank in wanted and printer.write(ev.host, ev.rank, ev.data),
                   on_problem=lambda text: err.print(Text(text, style="yellow")),
                   before_follow=show_copies, attempt=sel.attempt, on_idle=printer.tick)
        printer.flush()
        if follow and not stop_flag:
            record = _follow_later_attempts(registry, record, sel.attempt, printer, wanted, stop_flag, err)
    if not follow:
        show_copies()
        return EXIT_INTERRUPTED if stop_flag else EXIT_OK
    if stop_flag:
        err.print(Text(f"stopped following; run {run_id} goes on (`clusterrun stop {run_id}` ends it)", style="dim"))
        return EXIT_INTERRUPTED
    return _closing_summary(record, secrets)


def _show_copies(registry, record, sel, tail: Optional[int], aux: bool, secrets, fold: bool) -> None:
    """The local copies on stdout: rank after rank, or with fold side by side, folded line by line."""
    from ..runs.logs import log_copies, replay_copies, replay_interleaved
    from ..ui.console import FoldingPrinter, LogPrinter
    from ..ui.fold import REPLAY_WINDOW, Folder

    printer = LogPrinter(secrets=secrets)
    if not fold:
        for ev in replay_copies(registry, record, sel, tail=tail, aux=aux):
            printer.write(ev.host, None if ev.rank < 0 else ev.rank, ev.data, ev.stream)
        return
    step = [0]
    folding = FoldingPrinter(printer, len(sel.host_of), Folder(window=REPLAY_WINDOW), clock=lambda: step[0],
                             hold_setup=True)
    copies = log_copies(registry, record, sel, aux)
    # every host's setup side by side first (it ran before any rank), then the ranks and torchrun's messages
    for part in ([c for c in copies if c[3] == "setup"], [c for c in copies if c[3] != "setup"]):
        for step[0], ev in replay_interleaved(part, tail):
            folding.write(ev.host, ev.rank, ev.data, ev.stream)
        folding.flush()


def _await_turn(registry, record, err, secrets):
    """A queued run (launch --detach --wait): its standing on its hosts each time it changes, until it
    starts there; (the record then, None), or (it, the exit code) when it ended in line or Ctrl-C came."""
    import time

    from rich.text import Text

    from ..hosts.claims import WaitStatus
    from ..runs.logs import await_turn
    from ..ui.claims import wait_line

    since = record.created_at
    err.print(Text(f"run {record.id} waits in line on its hosts; following it once it starts (Ctrl-C stops "
                   "following, not the run)", style="dim"))
    stop_flag: List[bool] = []
    with forward_signals(lambda: stop_flag.append(True)):
        record = await_turn(registry, record.id, connect_for(record), stop_flag=stop_flag,
                            on_standing=lambda s: err.print(
                                Text(wait_line(WaitStatus.from_wire(s, time.time() - since)), style="yellow")))
    if stop_flag:
        err.print(Text(f"stopped waiting; run {record.id} stays in line (`clusterrun stop {record.id}` takes it "
                       "out)", style="dim"))
        return record, EXIT_INTERRUPTED
    if record.terminal and not any(r.started_at for r in record.ranks):  # it gave up waiting
        return record, _closing_summary(record, secrets)
    return record, None


def _follow_later_attempts(registry, record, attempt: int, printer, wanted, stop_flag: List[bool], err):
    """After the followed attempt ended: the run's record once it has its end; while its controller makes
    new attempts (job.restarts), those are followed too."""
    from rich.text import Text

    from ..runs.logs import await_end, fetch_logs

    while True:
        record = await_end(registry, record.id, connect_for(record), attempt, stop_flag)
        if record.terminal or stop_flag or record.attempt == attempt:
            return record
        attempt = record.attempt
        err.print(Text(f"attempt {attempt + 1} of {record.restarts + 1}", style="bold"))
        fetch_logs(registry, record.id, connect_for(record), follow=True, stop_flag=stop_flag,
                   on_lines=lambda ev: ev.rank in wanted and printer.write(ev.host, ev.rank, ev.data),
                   on_problem=lambda text: err.print(Text(text, style="yellow")), attempt=attempt,
                   on_idle=printer.tick)
        printer.flush()


def _closing_summary(record, secrets) -> int:
    """What an attached launch prints at the end (root cause, ranks, why, exit code); the run's exit code."""
    from rich.text import Text

    from ..runs.logs import recorded_outcome
    from ..states import RunState
    from ..ui.run_view import RunView

    view = RunView(quiet=True, secrets=secrets, inventory=record.inventory)
    if not record.terminal:  # the hosts could not all be asked, or a host was lost before its ranks' ends
        view.err.print(Text(f"run {record.id}: {record.state.value}; `clusterrun ps` asks its hosts again",
                            style="bold yellow"))
        return EXIT_CONNECT if record.state in (RunState.UNREACHABLE, RunState.UNKNOWN) else EXIT_FAILED
    out = recorded_outcome(record)
    view.outcome(out)
    return out.exit_code


@click.command()
@click.argument("run", required=False, shell_complete=_complete_runs)
@click.option("--grace", type=float, default=None, help="Seconds between TERM and KILL (default: the inventory's).")
@click.option("--hosts", "hosts_of", metavar="INVENTORY", type=click.Path(dir_okay=False),
              help="A run this registry does not know: look for it in the claims on INVENTORY's hosts.")
def stop(run: Optional[str], grace: Optional[float], hosts_of: Optional[str]) -> int:
    """Stop every rank of RUN by its recorded process group (TERM, grace, KILL). Safe to repeat.

    Without RUN: the newest run that is still running (or whose stop is pending on a host). Only your own
    runs: someone else's is refused, naming them.
    """
    from rich.text import Text

    from ..runs.reconcile import newest_open, reconcile
    from ..runs.stop import check_owner, stop_run
    from ..ui.console import console

    registry = store()
    err = console(stderr=True)
    if run is None:
        record = newest_open(registry, connect_for)
        if record is None:
            err.print(Text(_nothing_running(registry), style="bold"))
            return EXIT_OK
        check_owner(record)
    else:
        record = registry.get(_resolve(registry, run, hosts_of))
        check_owner(record)  # before asking its hosts anything
        record, _ = reconcile(registry, record.id, connect_for(record))  # has it ended since it was recorded?
    if not record.still_open:
        err.print(Text(f"run {record.id} already ended ({_ended_text(record)}), nothing to stop", style="bold"))
        if run is not None:
            live = newest_open(registry, connect_for)
            if live is not None:
                err.print(Text(f"run {live.id} is {live.state.value}: `clusterrun stop {live.id}` (or `clusterrun "
                               "stop`: the newest running run)", style="yellow"))
        return EXIT_OK
    record, failures = stop_run(registry, record.id, connect_for(record), grace)
    for name, exc in failures.items():
        err.print(Text(f"{name}: not stopped: {exc}", style="bold red"))
    err.print(Text(f"run {record.id}: {record.state.value}" + (f" ({record.reason})" if record.reason else ""),
                   style="bold"))
    if failures:
        err.print(Text("run `clusterrun stop` again once those hosts are reachable", style="yellow"))
        return EXIT_CONNECT
    return EXIT_OK


def _resolve(registry, run: str, hosts_of: Optional[str]) -> str:
    """The run id; one this registry does not know may be someone else's on the hosts (--hosts)."""
    from ..errors import RunNotFound

    try:
        return registry.resolve(run)
    except RunNotFound:
        if hosts_of:  # if the hosts' claims show it, say whose it is (NotYourRun)
            from ..runs.stop import refuse_foreign_on
            from .common import load

            refuse_foreign_on(load(hosts_of), run)
        raise




def _ended_text(record) -> str:
    """`succeeded at 12-01 20:10:43` (with the reason when there is one, on one line)."""
    import time

    from ..ui.tables import one_line

    when = f" at {time.strftime('%m-%d %H:%M:%S', time.localtime(record.ended_at))}" if record.ended_at else ""
    return f"{record.state.value}{when}" + (f": {one_line(record.reason, 120)}" if record.reason else "")


def _nothing_running(registry) -> str:
    ids = registry.ids(limit=1)
    if not ids:
        return "no runs yet; nothing to stop"
    return f"no run is running (the newest, {ids[0]}, ended: {_ended_text(registry.get(ids[0]))}); nothing to stop"
