"""What the commands share: loading an inventory as the CLI does, secrets from this shell, the registry,
connecting to a recorded run's hosts, and forwarding Ctrl-C/TERM/HUP to whatever is running."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Sequence, Tuple

import click

from ..errors import SecretMissing

if TYPE_CHECKING:  # loaded when a command needs it: `--version`, `--help` and `ps` never read YAML
    from ..config.inventory import Inventory

STOP_SIGNALS: Tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def without_gpu_check(inv: "Inventory") -> "Inventory":
    """--no-gpu-check: as if every host said gpu_check: false."""
    from dataclasses import replace

    return replace(inv, hosts=tuple(replace(h, gpu_check=False) for h in inv.hosts))


def load(path: str, script: Optional[str] = None, args: Optional[Sequence[str]] = None,
         module: Optional[str] = None) -> "Inventory":
    """The inventory with --script/--module and -- ARGS applied, SSH hosts' addresses filled from ~/.ssh/config."""
    from ..config.inventory import load_inventory, with_overrides

    inv = with_overrides(load_inventory(path), script=script, args=None if args is None else list(args),
                         module=module)
    from ..hosts.fds import ensure_fds

    ensure_fds(len(inv.hosts), sum(h.slots for h in inv.hosts), what=path)
    if any(h.connection == "ssh" for h in inv.hosts):
        from ..config.ssh_config import with_config_addresses
        from ..transport.openssh import config_options

        inv = with_config_addresses(inv, config_options())
    return inv


def given_args(job_args: Sequence[str]) -> Optional[List[str]]:
    """The job arguments after `--`: a bare `--` too (it clears job.args), None when there was no `--`
    (click drops the `--` itself: JobArgsCommand notes that it was there)."""
    ctx = click.get_current_context(silent=True)
    return list(job_args) if job_args or (ctx is not None and ctx.meta.get(DASHDASH)) else None


MIN_SECRET = 4  # shorter values cannot be masked without garbling ordinary output ("1" everywhere)


def secret_problem(inv: "Inventory") -> Optional[str]:
    """Why the launch would refuse the secrets in this shell (None: it would not)."""
    missing = [name for name in inv.secrets if name not in os.environ]
    if missing:
        return (f"{inv.path}: secrets {', '.join(missing)} are not set in this shell's environment "
                "(clusterrun takes secret values only from there)")
    short = [name for name in inv.secrets if len(os.environ[name]) < MIN_SECRET]
    if short:
        return (f"{inv.path}: secret {short[0]} is {len(os.environ[short[0]])} characters long: a value "
                f"under {MIN_SECRET} characters cannot be hidden in logs without garbling them (and is "
                "guessable anyway); use a longer value, or pass it in env: if it is not a secret")
    return None


def secrets_of(inv: "Inventory") -> dict:
    problem = secret_problem(inv)
    if problem:
        raise SecretMissing(problem)
    return {name: os.environ[name] for name in inv.secrets}


DASHDASH = "clusterrun.job_args_given"  # ctx.meta: the command line had a `--`


class JobArgsCommand(click.Command):
    """A command whose trailing arguments are the job's: an option it does not know says that job
    arguments go after `--`, with the command line that does it (rather than click's "did you mean
    --help?")."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        ctx.meta[DASHDASH] = "--" in args
        try:
            return super().parse_args(ctx, list(args))
        except click.NoSuchOption as exc:
            at = next((i for i, a in enumerate(args) if a == exc.option_name or a.startswith(exc.option_name + "=")),
                      len(args))
            close = [p for p in exc.possibilities or () if p not in ("--help", "-h")]
            fixed = shlex.join(["clusterrun", ctx.info_name or self.name or ""] + args[:at] + ["--"] + args[at:])
            raise click.UsageError(f"no such option: {exc.option_name}" + (
                f" (did you mean {close[0]}?); if it is the job's, it goes after `--`: {fixed}" if close else
                f"; arguments for the job go after `--`: {fixed}"), ctx) from None


def store():
    from ..registry.store import RunStore

    return RunStore()


def connect_for(record):
    """A connect function for the hosts of a recorded run, with the timeouts it was launched with (and the
    open files its hosts need)."""
    from ..hosts.fds import ensure_fds
    from ..runs.nodes import connect_for

    ensure_fds(len(record.hosts), len(record.ranks), what=f"run {record.id}")
    return connect_for(record)


@contextlib.contextmanager
def forward_signals(handler: Callable[[], None], signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """Call handler() (from the signal handler: it must only record the wish) on each of these signals while
    the block runs; the previous handlers come back after it."""
    previous = {sig: signal.signal(sig, lambda signum, frame: handler()) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
