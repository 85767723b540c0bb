"""The command line. The only module that prints or exits; everything else raises or returns."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from typing import List, Optional, Sequence

import click
from rich.table import Table
from rich.text import Text

from . import __version__
from .errors import EXIT_CONNECT, EXIT_INTERRUPTED, ClusterrunError, HostsFailed, SecretMissing
from .inventory import Inventory, check_job_files, load_inventory, with_overrides
from .ui import console

err = console(stderr=True)


def _fail(exc: BaseException) -> None:
    if isinstance(exc, ClusterrunError):
        err.print(Text(f"clusterrun: {exc}", style="bold red"))
        sys.exit(exc.exit_code)
    raise exc


def _load(path: str, script: Optional[str] = None, args: Optional[Sequence[str]] = None) -> Inventory:
    inv = load_inventory(path)
    inv = with_overrides(inv, script=script, args=list(args) if args else None)
    if any(h.connection == "ssh" for h in inv.hosts):
        from .transport.ssh import with_config_addresses

        inv = with_config_addresses(inv)
    return inv


def _secrets(inv: Inventory) -> dict:
    missing = [name for name in inv.secrets if name not in os.environ]
    if missing:
        raise SecretMissing(f"{inv.path}: secrets {', '.join(missing)} are not set in this shell's environment "
                            "(clusterrun takes secret values only from there)")
    return {name: os.environ[name] for name in inv.secrets}


def _store():
    from .store import RunStore

    return RunStore()


def _complete_runs(ctx, param, incomplete):
    try:
        return [i for i in _store().ids(limit=50) if i.startswith(incomplete)] + \
            (["latest"] if "latest".startswith(incomplete) else [])
    except Exception:  # completion must never crash the shell
        return []


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clusterrun")
def main() -> None:
    """Launch PyTorch distributed training on the hosts of an inventory, over SSH.

    Exit codes: 0 success, 1 job failed or a rank was lost, 2 usage or inventory error,
    3 connection/auth/host-key failure, 4 time limit, 130 interrupted.
    """


# ------------------------------------------------------------------ launch


@main.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--script", help="Training script (overrides job.script), relative to this directory.")
@click.option("--dry-run", is_flag=True, help="Show the rank table and each host's command; touch nothing.")
@click.option("--detach", is_flag=True, help="Return once every rank has started; print the run id.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def launch(inventory: str, script: Optional[str], dry_run: bool, detach: bool, as_json: bool,
           job_args: Sequence[str]) -> None:
    """Push the job to every host of INVENTORY, start all ranks, stream their logs, stop all on failure.

    Arguments after `--` replace job.args: clusterrun launch inv.yaml -- --epochs 3
    """
    try:
        inv = _load(inventory, script, job_args)
        check_job_files(inv)
        from .store import new_run_id

        run_id = new_run_id()
        if dry_run:  # shows secret names only, so it needs no values
            _dry_run(inv, run_id, as_json)
            return
        _launch(inv, run_id, _secrets(inv), detach)
    except ClusterrunError as exc:
        _fail(exc)


def _dry_run(inv: Inventory, run_id: str, as_json: bool) -> None:
    from .plan import MASK, build_plan, plan_to_dict, render_rank_command

    plan = build_plan(inv, run_id)
    if as_json:
        data = plan_to_dict(plan)
        data["secrets"] = {name: MASK for name in plan.secret_names}
        click.echo(json.dumps(data, indent=2))
        return
    out = console(stderr=False)
    table = Table(title=f"{plan.world_size} ranks on {len(plan.nodes)} hosts · MASTER_ADDR={plan.master_addr} "
                        f"MASTER_PORT={plan.master_port or 'auto'} · {plan.backend} {plan.init_url}",
                  title_justify="left")
    for col in ("rank", "local", "node", "host", "connection", "run folder"):
        table.add_column(col)
    for node in plan.nodes:
        target = node.host.host if node.host.connection == "local" else \
            f"{node.host.user + '@' if node.host.user else ''}{node.host.host}{':' + str(node.host.port) if node.host.port else ''}"
        for r in node.ranks:
            table.add_row(str(r.rank), str(r.local_rank), str(node.node_rank), node.host.name,
                          f"{node.host.connection} {target}", node.run_dir)
    out.print(table)
    for node in plan.nodes:
        for r in node.ranks:
            out.print(Text(f"# {node.host.name} rank {r.rank}", style="bold"))
            out.print(Text(render_rank_command(plan, node, r)))
    out.print(Text("dry run: nothing was connected to, pushed or started", style="dim"))


def _launch(inv: Inventory, run_id: str, secrets: dict, detach: bool) -> None:
    from .host_agent import make_connect
    from .runner import Runner
    from .sync import HashCache
    from .ui import RunView

    store = _store()
    view = RunView(secrets=secrets.values())
    runner = Runner(inv, run_id, store=store, connect=make_connect(inv.timeouts), secrets=secrets, emit=view.handle,
                    detach=detach, hash_cache=HashCache(os.path.join(store.home, "hashes.json")))
    err.print(Text(f"run {run_id}: {sum(h.slots for h in inv.hosts)} ranks on {len(inv.hosts)} hosts", style="bold"))

    def on_signal(signum, frame):
        runner.interrupt()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        outcome = runner.run()
    except HostsFailed as exc:
        view.close()
        _fail(exc)
        return
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        view.close()
    view.outcome(outcome)
    if detach and outcome.state == "running":
        click.echo(run_id)
        err.print(Text(f"detached: `clusterrun logs -f {run_id}`, `clusterrun ps`, `clusterrun stop {run_id}`",
                       style="dim"))
    sys.exit(outcome.exit_code)


# ------------------------------------------------------------------ ps, logs, stop


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


# ------------------------------------------------------------------ sweep


def _int_list(text: str, option: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}", param_hint=option)
    if not values:
        raise click.BadParameter("give at least one value", param_hint=option)
    return values


@main.command()
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
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def sweep(inventory: str, nodes: str, batch_sizes: str, init_methods: Optional[str], data_sizes: Optional[str],
          repeat: int, out_dir: Optional[str], metrics_path: str, fail_fast: bool, show_logs: bool,
          job_args: Sequence[str]) -> None:
    """Run a grid of ordinary runs (nodes x batch size x init method x data size) and plot the results.

    Re-running the same command resumes: points already done are skipped.
    """
    from . import sweep as sw
    from .events import LogLines
    from .sweep_report import plot, rows, write_tables
    from .sync import HashCache
    from .ui import LogPrinter

    try:
        inv = _load(inventory)
        check_job_files(inv)
        node_counts = _int_list(nodes, "--nodes")
        methods = (init_methods or inv.job.init_method).split(",")
        sizes = _int_list(data_sizes, "--data-size") if data_sizes else [None]
        sw.check_grid(inv, node_counts, methods)
        args = list(job_args) if job_args else list(inv.job.args)
        points = sw.grid(node_counts, _int_list(batch_sizes, "--batch-size"), methods, sizes, repeat)
        ident = sw.sweep_id(inv, points, args)
        folder = out_dir or os.path.join("sweeps", ident)
        state = sw.SweepState(folder, ident, points)
        store = _store()
        printer = LogPrinter(secrets=_secrets(inv).values())
    except ClusterrunError as exc:
        _fail(exc)
        return

    def on_run_event(ev) -> None:
        if show_logs and isinstance(ev, LogLines):
            printer.write(ev.host, ev.rank, ev.data)

    runner = sw.PointRunner(store=store, secrets=_secrets(inv), emit=on_run_event, metrics_path=metrics_path,
                            hash_cache=HashCache(os.path.join(store.home, "hashes.json")))

    def on_point(ev: "sw.PointEvent") -> None:
        style = {"succeeded": "green", "failed": "bold red", "interrupted": "yellow", "skipped": "dim"}.get(ev.status, "")
        text = f"[{ev.index}/{ev.total}] {ev.point.key}: {ev.status}"
        if ev.status not in ("starting", "skipped"):
            text += f" in {ev.seconds:.1f} s"
        if ev.run_id:
            text += f" (run {ev.run_id})"
        if ev.detail:
            text += f": {ev.detail}"
        err.print(Text(text, style=style))

    previous = {sig: signal.signal(sig, lambda s, f: runner.interrupt()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        finished = sw.run_sweep(inv, points, args, state, runner, on_point, fail_fast=fail_fast,
                                interrupted=lambda: runner.interrupted)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    table = rows(sw.points_in(state, points))
    written = write_tables(folder, table)
    try:
        written += plot(folder, table, note=f"{len(inv.hosts)}-host inventory {os.path.basename(inventory)}")
    except ImportError:
        err.print(Text("matplotlib is not installed: no plots (pip install 'clusterrun[plots]')", style="yellow"))
    _show_sweep(table)
    err.print(Text("results: " + ", ".join(written), style="dim"))
    failed = [r for r in table if r["status"] != "succeeded"]
    if runner.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(1 if failed or not finished else 0)


def _show_sweep(table) -> None:
    out = Table(title="sweep results (speed-up and efficiency against the fewest nodes)", title_justify="left")
    for col in ("point", "status", "ranks", "train s", "samples/s", "speed-up", "efficiency", "loss", "accuracy"):
        out.add_column(col)

    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for r in table:
        out.add_row(r["point"], r["status"], num(r["ranks"], "d"), num(r["train_s"], ".2f"),
                    num(r["samples_per_s"], ".0f"), num(r["speedup"], ".2f"), num(r["efficiency"], ".0%"),
                    num(r["final_loss"], ".3f"), num(r["test_accuracy"], ".3f"))
    err.print(out)


# ------------------------------------------------------------------ check


@main.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check(inventory: str, as_json: bool) -> None:
    """Check every host of INVENTORY before a launch; exit 0 when all pass, 3 when any fails."""
    from .check import run_checks, render_checks

    try:
        inv = _load(inventory)
        report = run_checks(inv)
    except ClusterrunError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        render_checks(report, console(stderr=False))
    sys.exit(0 if report.ok else EXIT_CONNECT)




if __name__ == "__main__":  # pragma: no cover
    main()
