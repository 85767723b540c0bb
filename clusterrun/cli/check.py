"""`clusterrun check`: the preflight doctor, rendered as a table (or JSON)."""

from __future__ import annotations

import json

import click

from ..errors import EXIT_CONNECT, EXIT_OK
from .common import load


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check(inventory: str, as_json: bool) -> int:
    """Check every host of INVENTORY before a launch; exit 0 when all pass, 3 when any fails."""
    from ..check.doctor import run_checks
    from ..ui.checks import render_checks
    from ..ui.console import console

    report = run_checks(load(inventory))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        render_checks(report, console(stderr=False))
    return EXIT_OK if report.ok else EXIT_CONNECT
