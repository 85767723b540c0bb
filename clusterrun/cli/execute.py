"""`clusterrun exec INVENTORY -- CMD [ARGS...]`: a command on every host at once, outputs folded."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import click

from ..errors import EXIT_CONNECT, EXIT_FAILED, EXIT_OK, CommandTimeout, ConnectError, HostError, UsageError
from .common import load

if TYPE_CHECKING:
    from ..hosts.execute import HostOutput


@click.command("exec")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--hosts", "only", default="", help="Only these hosts (inventory names, comma-separated).")
@click.option("--timeout", type=float, default=None, help="Seconds per host (default: timeouts.command).")
@click.option("--json", "as_json", is_flag=True, help="Every host's exit code, stdout and stderr as JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def execute(inventory: str, only: str, timeout: Optional[float], as_json: bool, command: Sequence[str]) -> int:
    """Run COMMAND on every host of INVENTORY in parallel; identical outputs are shown once.

    COMMAND and its arguments are passed as they are, quoted (no shell on the way):
    clusterrun exec inv.yaml -- nvidia-smi -L; for pipes, run a shell: -- sh -c 'pip list | grep torch'.
    Exit 0 when every host exited 0, 1 when one did not, 3 when one could not be reached.
    """
    from ..hosts.client import make_connect
    from ..hosts.execute import run_everywhere, select_hosts

    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("exec: give the command after --: clusterrun exec INVENTORY -- CMD [ARGS...]")
    inv = load(inventory)
    hosts = select_hosts(inv.hosts, only)
    done = run_everywhere(hosts, make_connect(inv.timeouts), command, timeout or inv.timeouts.command)
    outputs = [done.results[h.name] for h in hosts if h.name in done.results]
    failed = {name: f"{e.reason}: {e.message}" for name, e in done.errors.items()}
    _show(outputs, failed, as_json)
    return _exit_code(outputs, failed, done.errors)


def _show(outputs: List[HostOutput], failed: Dict[str, str], as_json: bool) -> None:
    """Every host's output (identical ones folded), and why the hosts that gave none failed."""
    from ..ui.console import LogPrinter, console
    from ..ui.tables import show_exec

    if as_json:
        click.echo(json.dumps([o.to_json() for o in outputs] +
                              [{"host": name, "exit_code": None, "error": why} for name, why in failed.items()],
                              indent=2))
    else:
        show_exec(outputs, failed, LogPrinter(), console(stderr=True))


def _exit_code(outputs: List[HostOutput], failed: Dict[str, str], errors: Dict[str, HostError]) -> int:
    # a command that timed out did reach its host: that is a failure, not an unreachable host
    if any(isinstance(e, ConnectError) and not isinstance(e, CommandTimeout) for e in errors.values()):
        return EXIT_CONNECT
    return EXIT_OK if not failed and all(o.exit_code == 0 for o in outputs) else EXIT_FAILED
