"""`clusterrun stacks` and `clusterrun top`: looking into a live run."""

from __future__ import annotations

import json
from typing import Optional, Sequence

import click

from ..errors import EXIT_CONNECT, EXIT_INTERRUPTED, EXIT_OK
from .common import connect_for, store
from .runs import _complete_runs


@click.command()
@click.argument("run", required=False, shell_complete=_complete_runs)
@click.option("--rank", "ranks", type=int, multiple=True, help="Only this rank, every thread in full (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--via", type=click.Choice(["auto", "py-spy", "faulthandler"]), default="auto", show_default=True,
              help="How to read them: py-spy where a host has it, else clusterrun's bootstrap (faulthandler).")
def stacks(run: Optional[str], ranks: Sequence[int], as_json: bool, via: str) -> int:
    """The Python stack of every thread of every rank of RUN, identical stacks folded, the odd rank first."""
    from ..runs.stacks import gather_stacks

    registry = store()
    run_id = registry.resolve(run)
    report = gather_stacks(registry, run_id, connect_for(registry.get(run_id)), ranks, via)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        from ..ui.console import console
        from ..ui.observe import show_stacks

        show_stacks(report, console(stderr=False), detail=bool(ranks))
    return EXIT_CONNECT if report.unreachable else EXIT_OK


@click.command()
@click.argument("target", required=False, shell_complete=_complete_runs)
@click.option("--once", is_flag=True, help="One sample of every host, then exit (also when not on a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: one JSON document per refresh.")
@click.option("--interval", type=float, default=None, help="Seconds between samples (default 2; 1 with --once).")
def top(target: Optional[str], once: bool, as_json: bool, interval: Optional[float]) -> int:
    """Live load of a run's hosts and ranks (TARGET: a run, default the latest), or of an INVENTORY's hosts
    and which clusterrun runs hold them (any user's claims and who waits): CPU, load, memory, network, GPUs; per rank CPU, RSS and seconds
    since its last line, stragglers marked. Sampled on the hosts, one SSH connection each."""
    import sys

    from ..runs.top import top_watch
    from ..ui.console import console
    from ..ui.observe import show_top, top_renderable
    from .common import forward_signals, load

    watch = top_watch(target, store, load)
    out = console(stderr=False)
    once = once or not sys.stdout.isatty() and not as_json
    interval = interval or (1.0 if once else 2.0)
    stop_flag: list = []
    with forward_signals(lambda: stop_flag.append(True)):
        if once:
            view = watch.watch(interval=interval, once=True, on_view=lambda v: None, stop_flag=stop_flag)
            click.echo(json.dumps(view.to_json(), indent=2)) if as_json else show_top(view, out)
        elif as_json:
            watch.watch(interval=interval, once=False, stop_flag=stop_flag,
                        on_view=lambda v: click.echo(json.dumps(v.to_json())))
        else:
            from rich.live import Live

            with Live(console=out, auto_refresh=False, transient=False) as live:
                watch.watch(interval=interval, once=False, stop_flag=stop_flag,
                            on_view=lambda v: live.update(top_renderable(v), refresh=True))
    return EXIT_INTERRUPTED if stop_flag else EXIT_OK  # a live view ends by Ctrl-C, as `logs -f` does
