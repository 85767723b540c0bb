"""`clusterrun check`: the preflight doctor, rendered as a table (or JSON); `--net`: the bandwidth map."""

from __future__ import annotations

import json
from typing import Optional

import click

from ..errors import EXIT_CONNECT, EXIT_OK, UsageError
from .common import load, without_gpu_check


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--net", is_flag=True, help="Measure TCP bandwidth and round trips between the hosts instead.")
@click.option("--mb", type=click.FloatRange(min=0.01, max=4096), default=None,
              help="With --net: MiB each link sends each way (default 32; at most 1 s per link).")
@click.option("--no-gpu-check", is_flag=True, help="Skip the GPU preflight (nvidia-smi, Xid, a CUDA op per GPU; "
                                                   "docs/gpus.md) on every host.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="With --net: write a heatmap of the matrix (PNG; needs matplotlib).")
@click.option("-v", "--verbose", is_flag=True, help="Also say how every host was reached over SSH (each value's origin).")
def check(inventory: str, as_json: bool, net: bool, mb: Optional[float], no_gpu_check: bool,
          plot_path: Optional[str], verbose: bool) -> int:
    """Check every host of INVENTORY before a launch.

    Exit 0 when every host passes (warnings allowed), 1 when a check fails, 3 when the only failures are
    hosts that could not be reached (--net: 3 when a link fails).
    """
    from ..ui.console import console

    if not net and (mb is not None or plot_path):
        raise UsageError("--mb and --plot go with --net")
    if net:
        return _net(load(inventory), as_json, mb, plot_path)
    from ..check.doctor import run_checks
    from ..ui.checks import render_checks

    inv = load(inventory)
    report = run_checks(without_gpu_check(inv) if no_gpu_check else inv)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        render_checks(report, console(stderr=False), verbose)
    return report.exit_code


def _net(inv, as_json: bool, mb: Optional[float], plot_path: Optional[str]) -> int:
    from ..check.bandwidth import DEFAULT_MB, plot, run_net_check
    from ..ui.checks import render_net
    from ..ui.console import console

    report = run_net_check(inv, mb=mb or DEFAULT_MB)
    plotted = None
    if plot_path:
        try:
            plotted = plot(report, plot_path)
        except ImportError:
            console(stderr=True).print("matplotlib is not installed: no plot (pip install 'clusterrun[plots]')",
                                       style="yellow", markup=False)
    if as_json:
        click.echo(json.dumps({**report.to_json(), "plot": plotted}, indent=2))
    else:
        render_net(report, console(stderr=False), plotted)
    return EXIT_OK if report.ok else EXIT_CONNECT
