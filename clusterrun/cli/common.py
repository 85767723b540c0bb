"""What the commands share: loading an inventory as the CLI does, secrets from this shell, the registry,
connecting to a recorded run's hosts, and forwarding Ctrl-C/TERM/HUP to whatever is running."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence, Tuple

from ..errors import SecretMissing

if TYPE_CHECKING:  # loaded when a command needs it: `--version`, `--help` and `ps` never read YAML
    from ..config.inventory import Inventory

STOP_SIGNALS: Tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def load(path: str, script: Optional[str] = None, args: Optional[Sequence[str]] = None,
         module: Optional[str] = None) -> "Inventory":
    """The inventory with --script/--module and -- ARGS applied, SSH hosts' addresses filled from ~/.ssh/config."""
    from ..config.inventory import load_inventory, with_overrides

    inv = with_overrides(load_inventory(path), script=script, args=list(args) if args else None, module=module)
    if any(h.connection == "ssh" for h in inv.hosts):
        from ..config.ssh_config import with_config_addresses
        from ..transport.openssh import config_options

        inv = with_config_addresses(inv, config_options())
    return inv


MIN_SECRET = 4  # shorter values cannot be masked without garbling ordinary output ("1" everywhere)


def secrets_of(inv: "Inventory") -> dict:
    missing = [name for name in inv.secrets if name not in os.environ]
    if missing:
        raise SecretMissing(f"{inv.path}: secrets {', '.join(missing)} are not set in this shell's environment "
                            "(clusterrun takes secret values only from there)")
    short = [name for name in inv.secrets if len(os.environ[name]) < MIN_SECRET]
    if short:
        raise SecretMissing(f"{inv.path}: secret {short[0]} is {len(os.environ[short[0]])} characters long: a value "
                            f"under {MIN_SECRET} characters cannot be hidden in logs without garbling them (and is "
                            "guessable anyway); use a longer value, or pass it in env: if it is not a secret")
    return {name: os.environ[name] for name in inv.secrets}


def store():
    from ..registry.store import RunStore

    return RunStore()


def connect_for(record):
    """A connect function for the hosts of a recorded run, with the timeouts it was launched with."""
    from ..config.inventory import Timeouts
    from ..hosts.client import make_connect

    return make_connect(Timeouts(**(record.snapshot.get("timeouts") or {})))


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
