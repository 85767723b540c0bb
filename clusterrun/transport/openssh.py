"""The SSH config as OpenSSH itself evaluates it: `ssh -G ALIAS` prints the effective options.

Asked only where it matters: when the config sets something clusterrun uses for the host, or holds
something only ssh can settle (`Match exec`, canonicalization); a host the config says nothing about costs
no process. A config ssh refuses is refused (ssh's own message, which names the file and line). Jump hosts
are looked up as ssh looks them up, `ssh -G -J EXTRA -l USER -p PORT HOP`.

Where no OpenSSH client is installed, config/ssh_config.py's own reading stands, with `Match exec` run
through $SHELL (as ssh runs it) and names canonicalized through the system's resolver; so it does where
$HOME is not the account's home (OpenSSH would read another ~/.ssh/config than clusterrun), unless
$CLUSTERRUN_SSH_CONFIG names the file (then `ssh -G -F FILE`).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import socket
import subprocess
import threading
from typing import Dict, Optional, Sequence, Tuple

from ..config.ssh_config import CONFIG_ENV, Resolved, from_openssh, read_config, to_expand
from ..errors import ClusterrunError, ConnectError, UsageError

log = logging.getLogger(__name__)
SSH_G_TIMEOUT = 10.0
EXEC_TIMEOUT = 60.0  # a `Match exec` command that runs longer is an error (ssh would wait for ever)


class SshRefused(Exception):
    """ssh -G exited non-zero: it refuses the config (or cannot resolve a name it must canonicalize)."""

    def __init__(self, alias: str, said: str):
        self.alias, self.said = alias, said
        super().__init__(said)


def ssh_g(alias: str, user: Optional[str] = None, port: Optional[int] = None, jump: Optional[str] = None,
          extra: Sequence[str] = ()) -> str:
    """What `ssh -G` prints for alias, with the inventory's user, port and jumps as -l, -p and -J (they take
    part in Match and canonicalization); raises SshRefused when ssh exits non-zero, OSError or subprocess
    errors when it cannot run."""
    config = ["-F", os.environ[CONFIG_ENV]] if os.environ.get(CONFIG_ENV) else []
    argv = ["ssh", "-G", *config] + (["-l", user] if user else []) + (["-p", str(port)] if port else []) + \
        (["-J", jump] if jump else []) + list(extra) + ["--", alias]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SSH_G_TIMEOUT)
    if done.returncode != 0:
        said = "; ".join(ln.strip() for ln in done.stderr.splitlines()
                         if ln.strip() and not ln.startswith("Pseudo-terminal"))
        raise SshRefused(alias, said[-600:] or f"exit status {done.returncode}")
    return done.stdout


def run_exec(command: str) -> int:
    """A `Match exec` command as ssh runs it: `$SHELL -c COMMAND`, stdin and stdout on /dev/null; its exit
    status (-1 when a signal ended it)."""
    shell = os.environ.get("SHELL") or "/bin/sh"
    if not os.access(shell, os.X_OK):
        raise UsageError(f'Match exec: shell "{shell}" is not executable (ssh runs Match exec through $SHELL)')
    try:
        done = subprocess.run([shell, "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              timeout=EXEC_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise UsageError(f"Match exec {command!r} did not finish within {EXEC_TIMEOUT:g} s") from None
    return done.returncode if done.returncode >= 0 else -1


def resolve_name(name: str) -> Optional[Tuple[str, str]]:
    """(an address, the canonical name) of name from the system's resolver, as ssh's getaddrinfo with
    AI_CANONNAME; None when it does not resolve."""
    try:
        found = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_CANONNAME)
    except (OSError, UnicodeError):
        return None
    return (found[0][4][0], found[0][3] or "") if found else None


def _relevant(ours: Resolved) -> bool:
    return bool(ours.needs_openssh) or any(src != "inventory" for src in ours.sources.values())


def config_options():
    """options(alias, user=None, port=None, jump=None) -> Resolved, cached per process."""
    cache: Dict[Tuple[str, Optional[str], Optional[int], Optional[str]], Resolved] = {}
    lock = threading.Lock()
    have_ssh = shutil.which("ssh") is not None and (bool(os.environ.get(CONFIG_ENV)) or _home_is_accounts())

    def options(alias: str, user: Optional[str] = None, port: Optional[int] = None,
                jump: Optional[str] = None) -> Resolved:
        key = (alias, user, port, jump)
        with lock:
            if key in cache:
                return cache[key]
        result = _with_ssh(alias, user, port, jump) if have_ssh else _own(alias, user, port, jump)
        with lock:
            cache[key] = result
        return result

    return options


def _own(alias: str, user: Optional[str], port: Optional[int], jump: Optional[str]) -> Resolved:
    return read_config(alias, user=user, port=port, jump=jump, run_exec=run_exec, resolve=resolve_name)


def _with_ssh(alias: str, user: Optional[str], port: Optional[int], jump: Optional[str]) -> Resolved:
    """ssh -G where the config has a say (clusterrun's own reading, without running anything, tells);
    ssh's verdict on a config it refuses stands, also where clusterrun's reading would refuse it too."""
    ours: Optional[Resolved] = None
    mine = ""
    try:
        ours = read_config(alias, user=user, port=port, jump=jump)
    except ClusterrunError as exc:
        mine = str(exc)  # ssh decides: a newer OpenSSH may know what 9.2 does not
    if ours is not None and not _relevant(ours):
        return ours
    try:
        output = ssh_g(alias, user, port, jump)
        expanded = {raw: _expanded_by_ssh(raw, alias, user, port, jump) for raw in to_expand(output)}
    except SshRefused as exc:
        also = f"; clusterrun's own reading says: {mine}" if mine else ""
        if "resolve" in exc.said.lower():
            raise ConnectError(alias, f"ssh -G {alias}: {exc.said}{also}") from None
        raise UsageError(f"{alias}: ssh refuses the SSH config: {exc.said} (what `ssh -G {alias}` says){also}") \
            from None
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("ssh -G %s failed, using clusterrun's own reading of the SSH config: %s", alias, exc)
        return _own(alias, user, port, jump)
    return from_openssh(output, alias, ours or Resolved(), expanded=expanded)


def _expanded_by_ssh(raw: str, alias: str, user: Optional[str], port: Optional[int], jump: Optional[str]) -> str:
    """An IdentityFile as ssh itself expands it when it connects (its tokens differ between versions: %C
    holds the jump host since OpenSSH 9.6): handed back as ControlPath, which ssh expands the same way
    before -G prints it."""
    quoted = '"' + raw.replace("\\", "\\\\").replace('"', '\\"') + '"'
    try:
        output = ssh_g(alias, user, port, jump, ["-o", f"ControlPath={quoted}"])
    except SshRefused as exc:
        raise UsageError(f"{alias}: IdentityFile {raw}: {exc.said} (ssh fails on it when it connects)") from None
    return next((ln[len("controlpath "):] for ln in output.splitlines() if ln.startswith("controlpath ")), raw)


def _home_is_accounts() -> bool:
    try:
        return os.path.realpath(os.path.expanduser("~")) == os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return False
