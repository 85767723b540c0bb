"""`clusterrun launch`: plan, then run (or only show the plan with --dry-run)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Optional, Sequence

import click

from ..events import counted
from .common import (JobArgsCommand, forward_signals, given_args, load, secret_problem, secrets_of, store,
                     without_gpu_check)

if TYPE_CHECKING:
    from ..config.inventory import Inventory


@click.command(cls=JobArgsCommand)
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--script", help="Training script (overrides job.script), relative to this directory.")
@click.option("--module", help="Run `python -m MODULE` in the pushed root instead (overrides job.script/module).")
@click.option("--dry-run", is_flag=True, help="Show the rank table and each host's command; touch nothing.")
@click.option("--detach", is_flag=True, help="Return once every rank has started; print the run id.")
@click.option("--wait", is_flag=True, help="When other runs hold the hosts' slots or GPUs, queue for them "
                                           "(first come, first served) instead of exiting 5.")
@click.option("--wait-timeout", metavar="D", default=None, help="With --wait: give up after D (90s, 30m, 2h); exit 5.")
@click.option("--no-gpu-check", is_flag=True, help="Skip the GPU preflight before the ranks start (docs/gpus.md).")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.option("--fold/--no-fold", default=None,
              help="The same line from many ranks at once shown once, with their set ([node[0-7] r*]); "
                   "default: on from 16 ranks.")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def launch(inventory: str, script: Optional[str], module: Optional[str], dry_run: bool, detach: bool, wait: bool,
           wait_timeout: Optional[str], no_gpu_check: bool, as_json: bool, fold: Optional[bool],
           job_args: Sequence[str]) -> int:
    """Push the job to every host of INVENTORY, start all ranks, stream their logs, stop all on failure.

    Arguments after `--` replace job.args: clusterrun launch inv.yaml -- --epochs 3

    Hosts are shared: a launch claims its slots and GPUs on every host first; when another run holds
    them it exits 5 naming that run, or with --wait queues behind it.
    """
    from ..plan import new_run_id

    timeout = _duration(wait_timeout) if wait_timeout is not None else None
    if timeout is not None and not wait:
        raise click.UsageError("--wait-timeout goes with --wait")
    inv = load(inventory, script, given_args(job_args), module=module)
    from ..config.inventory import check_job_files, with_rank_flags_decided

    check_job_files(inv)
    inv = with_rank_flags_decided(inv)
    if no_gpu_check:
        inv = without_gpu_check(inv)
    run_id = new_run_id()
    if dry_run:  # shows secret names only, so it needs no values
        return _dry_run(inv, run_id, as_json)
    return _launch(inv, run_id, secrets_of(inv), detach, wait, timeout, fold)


def _duration(text: str) -> float:
    from ..config.yaml_nodes import parse_duration

    value = parse_duration(text)
    if value is None or value <= 0:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 30m or 2h", param_hint="--wait-timeout")
    return value


def script_notes(inv: "Inventory") -> list:
    """What a launch says of the script before it starts: (text, style) lines."""
    from ..config.job import rendezvous_overrides

    notes = [(rank_flags_note(inv), "dim")] if rank_flags_note(inv) else []
    return notes + [(f"warning: {w}", "yellow") for w in rendezvous_overrides(inv.job, len(inv.hosts))]


def rank_flags_note(inv: "Inventory") -> str:
    """What a launch says when it left --rank/--world-size out because of what the script is ("" otherwise)."""
    if inv.job.rank_flags_from != "script":
        return ""
    entry = inv.job.script or inv.job.module
    return (f"{entry} parses its own options and declares no --rank/--world-size: they are not passed (its ranks "
            "read RANK, WORLD_SIZE, LOCAL_RANK from the environment); job.rank_flags: true passes them")


def _dry_run(inv: "Inventory", run_id: str, as_json: bool) -> int:
    from rich.text import Text

    from ..plan import MASK, build_plan, plan_to_dict
    from ..ui.console import console
    from ..ui.tables import show_plan

    from ..launch.environment import dry_run, dry_run_lines

    plan = build_plan(inv, run_id)
    routes = _routes(inv)
    environment = dry_run(inv)
    err = console(stderr=True)
    for text, style in script_notes(inv):
        err.print(Text(text, style=style))
    if secret_problem(inv):  # the launch would refuse: say so now rather than after the user trusts the plan
        err.print(Text(f"warning: {secret_problem(inv)}; `launch` without --dry-run would refuse (exit 2)",
                       style="yellow"))
    if as_json:
        data = plan_to_dict(plan)
        data["secrets"] = {name: MASK for name in plan.secret_names}
        if environment is not None:
            data["environment"] = environment
        for node in data["nodes"]:
            if node["name"] in routes:
                node["ssh"] = routes[node["name"]].to_json()
        click.echo(json.dumps(data, indent=2))
    else:
        show_plan(plan, console(stderr=False), {name: t.provenance() for name, t in routes.items()})
        for line in dry_run_lines(environment) if environment is not None else []:
            err.print(Text(line))
    return 0


def _routes(inv: "Inventory") -> dict:
    """name -> SshTarget of each SSH host (each value with where it came from); nothing connects."""
    if not any(h.connection == "ssh" for h in inv.hosts):
        return {}
    from ..config.ssh_config import ssh_target
    from ..transport.openssh import config_options

    options = config_options()
    return {h.name: ssh_target(h, options) for h in inv.hosts if h.connection == "ssh"}


def _launch(inv: "Inventory", run_id: str, secrets: dict, detach: bool, wait: bool = False,
            wait_timeout: Optional[float] = None, fold: Optional[bool] = None) -> int:
    from ..hosts.client import make_connect

    connect = make_connect(inv.timeouts, ahead=inv.hosts)  # the handshakes go on while the rest loads

    from rich.text import Text

    from ..errors import HostsBusy
    from ..hosts.manifest import HashCache
    from ..launch.runner import Runner
    from ..states import RunState
    from ..ui.run_view import RunView

    from ..clean.retention import AfterLaunch

    registry = store()
    from ..ui.fold import fold_wanted

    world = sum(h.slots for h in inv.hosts)
    view = RunView(secrets=secrets.values(), inventory=inv.path, hosts=len(inv.hosts),
                   fold=fold_wanted(fold, world), world=world)
    retention = AfterLaunch(inv)

    def emit(ev: object) -> None:
        view.handle(ev)
        retention.on_event(ev)

    runner = Runner(inv, run_id, store=registry, connect=connect, secrets=secrets,
                    emit=emit, detach=detach, hash_cache=HashCache(os.path.join(registry.home, "hashes.json")),
                    wait=wait, wait_timeout=wait_timeout)
    view.err.print(Text(f"run {run_id}: {counted(sum(h.slots for h in inv.hosts), 'rank')} on "
                        f"{counted(len(inv.hosts), 'host')}",
                        style="bold"))
    for text, style in script_notes(inv):
        view.err.print(Text(text, style=style))
    try:
        with forward_signals(runner.interrupt):
            outcome = runner.run()
    except HostsBusy as exc:  # exit 5: who holds what, as a table, then the one line
        view.close()
        view.busy(exc)
        return exc.exit_code
    finally:
        view.close()
    waiting = detach and outcome.state is RunState.WAITING  # --detach --wait: its hosts start it in its turn
    if detach and (outcome.state is RunState.RUNNING or waiting):
        retention.start()
    view.outcome(outcome)
    if detach and (outcome.state is RunState.RUNNING or waiting):
        click.echo(run_id)
        if waiting:
            view.err.print(Text(f"queued: it waits on its hosts for its turn and starts by itself; "
                                f"`clusterrun ps --hosts {inv.path}` shows the line", style="bold"))
        view.err.print(Text(f"detached: `clusterrun logs -f {run_id}`, `clusterrun ps`, `clusterrun stop {run_id}`",
                            style="dim"))
    return outcome.exit_code
