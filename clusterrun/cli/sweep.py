"""`clusterrun sweep`: the grid of runs, its progress lines, and the results table."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, List, Optional, Sequence

import click

from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from .common import JobArgsCommand, forward_signals, given_args, load, secret_problem, secrets_of, store

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from ..sweep.grid import PointEvent


def _int_list(text: str, option: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}", param_hint=option) from None
    if not values:
        raise click.BadParameter("give at least one value", param_hint=option)
    return values


@click.command(cls=JobArgsCommand)
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--nodes", default="1", show_default=True, help="Node counts (the first n hosts), e.g. 1,2,4.")
@click.option("--batch-size", "batch_sizes", default="64", show_default=True, help="Per-rank batch sizes, e.g. 32,64.")
@click.option("--init-method", "init_methods", default=None, help="e.g. tcp,file (default: the inventory's).")
@click.option("--data-size", "data_sizes", default=None, help="Training samples, e.g. 1000,4000 (--data-size K).")
@click.option("--repeat", default=1, show_default=True, help="Runs per point.")
@click.option("--out", "out_dir", default=None, help="Results folder (default: sweeps/<sweep id>).")
@click.option("--metrics", "metrics_path", default="out/metrics.json", show_default=True,
              help="Rank 0's metrics file, relative to the job folder.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first failed point.")
@click.option("--logs", "show_logs", is_flag=True, help="Show the ranks' output too.")
@click.option("--fold/--no-fold", default=None,
              help="With --logs: the same line from many ranks shown once with their set (default: from 16 ranks).")
@click.option("--note", default=None, help="A line under the plots' titles (say what machines these were).")
@click.option("--dry-run", is_flag=True, help="List the points and what each would run; touch nothing.")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def sweep(inventory: str, nodes: str, batch_sizes: str, init_methods: Optional[str], data_sizes: Optional[str],
          repeat: int, out_dir: Optional[str], metrics_path: str, fail_fast: bool, show_logs: bool,
          fold: Optional[bool], note: Optional[str], dry_run: bool, job_args: Sequence[str]) -> int:
    """Run a grid of ordinary runs (nodes x batch size x init method x data size) and plot the results.

    Re-running the same command resumes: points already done are skipped.
    """
    from rich.text import Text

    from ..hosts.manifest import HashCache
    from ..sweep import grid as sw
    from ..sweep.report import rows
    from ..ui.console import console
    from ..ui.tables import show_sweep

    inv = load(inventory)
    from ..config.inventory import check_job_files, with_rank_flags_decided

    check_job_files(inv)
    inv = with_rank_flags_decided(inv)
    node_counts = _int_list(nodes, "--nodes")
    methods = (init_methods or inv.job.init_method).split(",")
    sizes = _int_list(data_sizes, "--data-size") if data_sizes else [None]
    sw.check_grid(inv, node_counts, methods)
    given = given_args(job_args)
    args = list(inv.job.args) if given is None else given
    points = sw.grid(node_counts, _int_list(batch_sizes, "--batch-size"), methods, sizes, repeat)
    ident = sw.sweep_id(inv, points, args)
    folder = out_dir or os.path.join("sweeps", ident)
    state = sw.SweepState(folder, ident, points)
    if dry_run:
        return _dry_run(inv, points, args, state, console(stderr=False))
    registry = store()
    secrets = secrets_of(inv)
    printer, on_run_event = _run_logs(show_logs, fold, sum(h.slots for h in inv.hosts), secrets.values())
    err = console(stderr=True)
    runner = sw.PointRunner(store=registry, secrets=secrets, emit=on_run_event, metrics_path=metrics_path,
                            hash_cache=HashCache(os.path.join(registry.home, "hashes.json")))

    def on_point(ev: "sw.PointEvent") -> None:
        printer.flush()
        err.print(_point_line(ev))

    with forward_signals(runner.interrupt):
        finished = sw.run_sweep(inv, points, args, state, runner, on_point, fail_fast=fail_fast,
                                interrupted=lambda: runner.interrupted)
    printer.flush()
    table = rows(sw.points_in(state, points))
    written = _write_results(folder, table, note or f"{len(inv.hosts)}-host inventory {os.path.basename(inventory)}",
                             err)
    show_sweep(table, err)
    err.print(Text("results: " + ", ".join(written), style="dim"))
    failed = [r for r in table if r["status"] != "succeeded"]
    if runner.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if failed or not finished else EXIT_OK



def _run_logs(show_logs: bool, fold: Optional[bool], ranks: int, secrets):
    """The printer of --logs and the runs' event handler feeding it (folding from FOLD_AT ranks)."""
    from ..events import LogLines, Tick
    from ..ui.console import log_printer
    from ..ui.fold import fold_wanted

    # each point has its own number of ranks: a folded line names its ranks, never `r*`
    printer = log_printer(secrets, fold_wanted(fold, ranks))

    def on_run_event(ev) -> None:
        if not show_logs:
            return
        if isinstance(ev, LogLines):
            printer.write(ev.host, ev.rank, ev.data, ev.stream)
        elif isinstance(ev, Tick):
            printer.tick()
        else:
            printer.flush()

    return printer, on_run_event


def _dry_run(inv, points, args: Sequence[str], state, out: "Console") -> int:
    """Each point as it would run (hosts, ranks, init method, the job's arguments), those done marked."""
    from rich.text import Text

    from ..sweep.grid import point_inventory

    for i, point in enumerate(points, 1):
        pinv = point_inventory(inv, point, args)
        done = " (done before: skipped)" if state.done(point) else ""
        hosts = f"{len(pinv.hosts)} host{'s' if len(pinv.hosts) != 1 else ''}"
        out.print(Text(f"[{i}/{len(points)}] {point.key}{done}: {hosts} "
                       f"({', '.join(h.name for h in pinv.hosts)}), {sum(h.slots for h in pinv.hosts)} rank(s), "
                       f"init {point.init_method}, job args: {shlex.join(pinv.job.args)}"))
    problem = secret_problem(inv)
    if problem:
        out.print(Text(f"warning: {problem}; the sweep without --dry-run would refuse (exit 2)", style="yellow"))
    out.print(Text(f"dry run: nothing was connected to, pushed or started; results would go to {state.folder}",
                   style="dim"))
    return EXIT_OK


_STATUS_STYLES = {"succeeded": "green", "failed": "bold red", "interrupted": "yellow", "skipped": "dim"}


def _point_line(ev: PointEvent) -> Text:
    """The progress line of one point: how it ended, in how long, its run and why."""
    from rich.text import Text

    text = f"[{ev.index}/{ev.total}] {ev.point.key}: {ev.status}"
    if ev.status not in ("starting", "skipped"):
        text += f" in {ev.seconds:.1f} s"
    if ev.run_id:
        text += f" (run {ev.run_id})"
    if ev.detail:
        text += f": {ev.detail}"
    return Text(text, style=_STATUS_STYLES.get(ev.status, ""))


def _write_results(folder: str, table: List[dict], note: str, err: Console) -> List[str]:
    """The results tables, and the plots where matplotlib is installed: the files written."""
    from rich.text import Text

    from ..sweep.report import plot, write_tables

    written = write_tables(folder, table)
    try:
        written += plot(folder, table, note=note)
    except ImportError:
        err.print(Text("matplotlib is not installed: no plots (pip install 'clusterrun[plots]')", style="yellow"))
    return written
