"""The SSH config as OpenSSH itself evaluates it: `ssh -G ALIAS` prints the effective options.

Asked only where it matters: when the config holds something for the host (or something only OpenSSH
can evaluate, such as `Match exec`); a host the config says nothing about costs no process. Where no
OpenSSH client is installed, config/ssh_config.py's own reading (Include, Host, Match, tokens) stands;
so it does where $HOME is not the account's home (OpenSSH would read another ~/.ssh/config than
clusterrun), unless $CLUSTERRUN_SSH_CONFIG names the file (then `ssh -G -F FILE`).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import threading
from typing import Dict, Optional, Tuple

from ..config.ssh_config import CONFIG_ENV, Resolved, from_openssh, read_config

log = logging.getLogger(__name__)
SSH_G_TIMEOUT = 10.0


def ssh_g(alias: str, user: Optional[str] = None, port: Optional[int] = None) -> str:
    """What `ssh -G` prints for alias (with the inventory's user and port, as `-l`/`-p`: they take part in
    Match); raises OSError or subprocess errors when it cannot run."""
    config = ["-F", os.environ[CONFIG_ENV]] if os.environ.get(CONFIG_ENV) else []
    argv = ["ssh", "-G", *config] + (["-l", user] if user else []) + (["-p", str(port)] if port else []) + \
        ["--", alias]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SSH_G_TIMEOUT)
    if done.returncode != 0:
        raise OSError(f"ssh -G {alias} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return done.stdout


def config_options():
    """options(alias, user=None, port=None) -> Resolved, cached per process."""
    cache: Dict[Tuple[str, Optional[str], Optional[int]], Resolved] = {}
    lock = threading.Lock()
    have_ssh = shutil.which("ssh") is not None and (bool(os.environ.get(CONFIG_ENV)) or _home_is_accounts())

    def options(alias: str, user: Optional[str] = None, port: Optional[int] = None) -> Resolved:
        key = (alias, user, port)
        with lock:
            if key in cache:
                return cache[key]
        ours = read_config(alias, user=user, port=port)
        relevant = ours.needs_openssh or any(src not in ("inventory",) for src in ours.sources.values())
        result = ours
        if ours.needs_openssh and not have_ssh:
            log.warning("%s: %s can be evaluated by an OpenSSH client only (`ssh`, not found here, or $HOME is "
                        "not your account's home): clusterrun takes it as not matching; install openssh-client, "
                        "or give the host's options in the inventory", alias, ours.needs_openssh)
        if have_ssh and relevant:
            try:
                result = from_openssh(ssh_g(alias, user, port), alias, ours)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("ssh -G %s failed, using clusterrun's own reading of the SSH config: %s", alias, exc)
        with lock:
            cache[key] = result
        return result

    return options


def _home_is_accounts() -> bool:
    try:
        return os.path.realpath(os.path.expanduser("~")) == os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return False
