"""The command line. The only module that prints or exits; everything else raises or returns."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Optional, Sequence

import click
from rich.text import Text

from . import __version__
from .errors import EXIT_CONNECT, ClusterrunError, HostsFailed, SecretMissing
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

    from rich.table import Table

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
        user = f"{node.host.user}@" if node.host.user else ""
        port = f":{node.host.port}" if node.host.port else ""
        target = node.host.host if node.host.connection == "local" else f"{user}{node.host.host}{port}"
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




# the other commands live beside this file; importing them registers them on `main`
from . import cli_runs, cli_sweep  # noqa: E402,F401

if __name__ == "__main__":  # pragma: no cover
    main()
