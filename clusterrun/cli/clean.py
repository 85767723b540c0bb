"""`clusterrun clean`: finished runs' folders off their hosts, the content cache collected, the registry
pruned (--local)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import click

from ..errors import EXIT_OK, UsageError
from .common import store

if TYPE_CHECKING:  # loaded when a clean runs: --help reads no inventory code
    from ..clean.policy import Rules
    from ..config.inventory import Host, Timeouts
    from ..registry.store import RunStore


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
@click.option("--force", is_flag=True, help="Also runs whose outputs (job.outputs) were never pulled.")
@click.option("--leftovers", is_flag=True, help="Instead: list the processes that hold the hosts' GPUs and kill "
                                                "exactly ended runs' own (the RUN named, or every ended run of "
                                                "the INVENTORY's hosts); never another user's or an unknown one.")
def clean(targets: Sequence[str], keep: Optional[int], older_than: Optional[str], cache: bool, dry_run: bool,
          as_json: bool, local: bool, foreign: bool, retention: bool, force: bool, leftovers: bool) -> int:
    """Remove finished runs' folders from their hosts: TARGETS is an INVENTORY (its hosts) or run ids.

    Never a run that runs or may still run, nor (unless --force) one whose outputs were never pulled.
    Logs are copied here first. Exit 0; 1 when a host refused (a run named that still runs) or failed;
    3 when a host could not be reached.
    """
    from ..clean.policy import Rules

    if keep is not None and keep < 0:
        raise UsageError(f"--keep {keep}: give 0 or more")
    age = _older_than(older_than)
    registry = store()
    inventory = targets[0] if len(targets) == 1 and os.path.isfile(targets[0]) else None
    runs = () if inventory else tuple(registry.resolve(t) for t in targets)
    rules = Rules(keep=keep, older_than_s=age, runs=runs, foreign=foreign, force=force)
    if leftovers:
        return _leftovers(registry, inventory, runs, rules, dry_run, as_json)
    if local:
        return _local(registry, rules, dry_run, as_json)
    if not targets:
        raise UsageError("clean: give an INVENTORY (its hosts) or run ids; --local for this machine's registry")
    from ..clean.apply import clean_hosts, exit_code
    from ..hosts.client import make_connect

    where = _inventory_targets(inventory, rules, retention) if inventory else \
        _run_targets(registry, runs, rules, retention)
    if where is None:
        return EXIT_OK
    from rich.text import Text

    from ..ui.console import console

    err = console(stderr=True)
    results = clean_hosts(where.hosts, registry, make_connect(where.timeouts), where.rules, cache=cache,
                          cache_max=where.cache_max, dry_run=dry_run,
                          on_problem=lambda text: err.print(Text(text, style="yellow")))
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "rules": where.rules.describe(),
                               "hosts": [r.to_json() for r in results]}, indent=2))
    else:
        from ..ui.tables import show_clean

        show_clean(results, where.rules.describe(), dry_run, err)
    return exit_code(results)


@dataclass(frozen=True)
class _Targets:
    """The hosts a clean visits, how to reach them, and the rules it applies there."""

    hosts: List[Host]
    timeouts: Timeouts
    rules: Rules
    cache_max: Optional[int] = None  # the content cache is collected down to this (retention's cache_max)


def _older_than(text: Optional[str]) -> Optional[float]:
    """--older-than in seconds (None: not given)."""
    from ..config.yaml_nodes import parse_duration

    if text is None:
        return None
    age = parse_duration(text)
    if age is None or age < 0:
        raise UsageError(f"--older-than {text!r}: give a duration such as 90m, 12h or 7d")
    return age


def _inventory_targets(inventory: str, rules: Rules, retention: bool) -> Optional[_Targets]:
    """The inventory's hosts; with --retention its retention: rules instead (None: retention is off)."""
    from .common import load

    inv = load(inventory)
    if not retention:
        return _Targets(list(inv.hosts), inv.timeouts, rules)
    if not inv.retention.enabled:
        return None
    from ..clean.policy import Rules

    return _Targets(list(inv.hosts), inv.timeouts, Rules(keep=inv.retention.keep_runs,
                                                         older_than_s=inv.retention.max_age_s),
                    inv.retention.cache_max)


def _run_targets(registry: RunStore, runs: Tuple[str, ...], rules: Rules, retention: bool) -> _Targets:
    """Every host the runs named were launched on."""
    from ..clean.apply import hosts_of_runs
    from ..config.inventory import Timeouts

    if retention:
        raise UsageError("--retention applies an inventory's rules: give the INVENTORY")
    return _Targets(hosts_of_runs(registry, runs), Timeouts(), rules)


def _leftovers(registry, inventory: Optional[str], runs: Tuple[str, ...], rules: "Rules", dry_run: bool,
               as_json: bool) -> int:
    """clean --leftovers: one RUN's (its hosts, from the registry), or every ended run's on an INVENTORY's hosts."""
    from ..clean.leftovers import leftovers
    from ..errors import EXIT_CONNECT, EXIT_FAILED
    from ..hosts.client import make_connect

    if len(runs) > 1 or not (inventory or runs):
        raise UsageError("clean --leftovers: give one RUN, or an INVENTORY (every ended run's leftovers there)")
    where = _inventory_targets(inventory, rules, False) if inventory else _run_targets(registry, runs, rules, False)
    kill = "" if dry_run else (runs[0] if runs else "*")
    found, errors = leftovers(where.hosts, make_connect(where.timeouts), kill=kill)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "leftovers": [x.to_json() for x in found],
                               "errors": {h: str(e) for h, e in errors.items()}}, indent=2))
    else:
        from ..ui.console import console
        from ..ui.tables import show_leftovers

        show_leftovers(found, errors, dry_run, console(stderr=True), runs[0] if runs else "*")
    if errors:
        return EXIT_CONNECT if all(e.exit_code == EXIT_CONNECT for e in errors.values()) else EXIT_FAILED
    return EXIT_OK


def _local(registry, rules, dry_run: bool, as_json: bool) -> int:
    from ..clean.apply import clean_local

    done = clean_local(registry, rules, dry_run)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "runs": [{"id": i, "removed": r, "why": w} for i, r, w in done]},
                              indent=2))
        return EXIT_OK
    from ..ui.console import console
    from ..ui.tables import show_local_clean

    show_local_clean(done, dry_run, console(stderr=True))
    return EXIT_OK
