"""`clusterrun clean`: finished runs' folders off their hosts, the content cache collected, the registry
pruned (--local); also how a launch applies the inventory's retention in the background."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional, Sequence

import click

from ..errors import EXIT_OK, UsageError
from .common import store


@click.command()
@click.argument("targets", nargs=-1)
@click.option("--keep", type=int, default=None, help="Keep the newest N finished runs per host.")
@click.option("--older-than", default=None, help="Only runs that ended longer ago than this (90m, 12h, 7d).")
@click.option("--cache", is_flag=True, help="Also drop cached job files that no remaining run folder uses.")
@click.option("--dry-run", is_flag=True, help="Say what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--local", is_flag=True, help="Prune this machine's registry and log copies instead of the hosts.")
@click.option("--foreign", is_flag=True, help="Also runs this registry does not know (another controller's).")
@click.option("--retention", is_flag=True, help="Apply the inventory's retention: (what a launch does itself).")
def clean(targets: Sequence[str], keep: Optional[int], older_than: Optional[str], cache: bool, dry_run: bool,
          as_json: bool, local: bool, foreign: bool, retention: bool) -> int:
    """Remove finished runs' folders from their hosts: TARGETS is an INVENTORY (its hosts) or run ids.

    Never a run that runs or may still run. Logs are copied here first. Exit 0; 1 when a host refused
    (a run named that still runs) or failed; 3 when a host could not be reached.
    """
    from ..clean.policy import Rules
    from ..config.yaml_nodes import parse_duration

    if keep is not None and keep < 0:
        raise UsageError(f"--keep {keep}: give 0 or more")
    age = None
    if older_than is not None:
        age = parse_duration(older_than)
        if age is None or age < 0:
            raise UsageError(f"--older-than {older_than!r}: give a duration such as 90m, 12h or 7d")
    registry = store()
    inventory = targets[0] if len(targets) == 1 and os.path.isfile(targets[0]) else None
    runs = () if inventory else tuple(registry.resolve(t) for t in targets)
    rules = Rules(keep=keep, older_than_s=age, runs=runs, foreign=foreign)
    if local:
        return _local(registry, rules, dry_run, as_json)
    if not targets:
        raise UsageError("clean: give an INVENTORY (its hosts) or run ids; --local for this machine's registry")
    from ..clean.run import clean_hosts, exit_code, hosts_of_runs
    from ..config.inventory import Timeouts
    from ..hosts.client import make_connect

    cache_max = None
    if inventory:
        from .common import load

        inv = load(inventory)
        hosts, timeouts = list(inv.hosts), inv.timeouts
        if retention:
            if not inv.retention.enabled:
                return EXIT_OK
            rules = Rules(keep=inv.retention.keep_runs, older_than_s=inv.retention.max_age_s)
            cache_max = inv.retention.cache_max
    else:
        if retention:
            raise UsageError("--retention applies an inventory's rules: give the INVENTORY")
        hosts, timeouts = hosts_of_runs(registry, runs), Timeouts()
    from rich.text import Text

    from ..ui.console import console

    err = console(stderr=True)
    results = clean_hosts(hosts, registry, make_connect(timeouts), rules, cache=cache, cache_max=cache_max,
                          dry_run=dry_run, on_problem=lambda text: err.print(Text(text, style="yellow")))
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "rules": rules.describe(),
                               "hosts": [r.to_json() for r in results]}, indent=2))
    else:
        from ..ui.tables import show_clean

        show_clean(results, rules.describe(), dry_run, err)
    return exit_code(results)


def _local(registry, rules, dry_run: bool, as_json: bool) -> int:
    from ..clean.run import clean_local

    done = clean_local(registry, rules, dry_run)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "runs": [{"id": i, "removed": r, "why": w} for i, r, w in done]},
                              indent=2))
        return EXIT_OK
    from ..ui.console import console
    from ..ui.tables import show_local_clean

    show_local_clean(done, dry_run, console(stderr=True))
    return EXIT_OK


AFTER_PID_WAIT = 60.0
_WAITER = ("import os, sys, time\n"
           "pid, limit, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]\n"
           "end = time.monotonic() + limit\n"
           "while time.monotonic() < end:\n"
           "    try:\n"
           "        os.kill(pid, 0)\n"
           "    except OSError:\n"
           "        break\n"
           "    time.sleep(0.2)\n"
           "os.execv(argv[0], argv)\n")


def spawn_retention(inventory: str) -> None:
    """After a launch started: `clusterrun clean INVENTORY --retention` in a process of its own (its own
    session, niced, output to retention.log in the state dir). It starts its work once the launching
    process has ended, or a minute into the run: a short run never shares its CPU with it, a long one
    has its hosts cleaned while it trains."""
    from ..registry.store import state_dir

    folder = state_dir()
    os.makedirs(folder, 0o700, exist_ok=True)
    log = open(os.path.join(folder, "retention.log"), "ab")
    try:
        # a bare interpreter waits (no imports: nothing competes with a short run for the CPU), then
        # becomes `clusterrun clean` (which waits no more: the launch has ended or a minute passed)
        subprocess.Popen([sys.executable, "-S", "-c", _WAITER, str(os.getpid()), str(AFTER_PID_WAIT), sys.executable,
                          "-m", "clusterrun", "clean", os.path.abspath(inventory), "--retention"],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         preexec_fn=lambda: os.nice(10), env={**os.environ, "NO_COLOR": "1"})
    finally:
        log.close()
