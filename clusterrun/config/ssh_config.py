"""Where and how to reach an SSH host: the inventory's values over ~/.ssh/config's, as a `SshTarget`.

Pure given `options`, a function from an alias to the effective options OpenSSH would use for it
(lower-case keys, as `ssh -G` prints them); the transport connects to targets and never sees an
inventory Host.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Tuple

from .inventory import Host, Inventory

Options = Callable[[str], Mapping[str, object]]


@dataclass(frozen=True)
class SshTarget:
    label: str  # the inventory's name for the host: every message names it
    alias: str  # what the user wrote (an ssh_config alias, a name or an address)
    hostname: str
    port: int
    user: str
    identity_files: Tuple[str, ...]
    known_hosts: str
    host_key_policy: str  # strict | accept-new
    jumps: Tuple["SshTarget", ...] = ()  # ProxyJump hops, first hop first
    proxy_command: Optional[str] = None


def _first(value: object) -> Optional[str]:
    if isinstance(value, (list, tuple)):
        return str(value[0]) if value else None
    return None if value is None else str(value)


def _files(value: object) -> Tuple[str, ...]:
    if value is None:
        return ()
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else (str(value),)


def ssh_target(host: Host, options: Options) -> SshTarget:
    """The target for an inventory host; inventory values win over ~/.ssh/config's."""
    found = options(host.host)
    jump = host.proxy_jump or _first(found.get("proxyjump"))
    jumps = () if jump in (None, "none") else tuple(_jump(spec, host, options) for spec in jump.split(","))
    command = None if host.proxy_jump else _first(found.get("proxycommand"))
    return SshTarget(
        label=host.name, alias=host.host, hostname=_first(found.get("hostname")) or host.host,
        port=host.port or int(_first(found.get("port")) or 22),
        user=host.user or _first(found.get("user")) or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(f) for f in ((host.identity_file,) if host.identity_file
                                                              else _files(found.get("identityfile")))),
        known_hosts=os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts"),
        host_key_policy=host.host_key_policy, jumps=jumps, proxy_command=None if command == "none" else command)


def _jump(spec: str, host: Host, options: Options) -> SshTarget:
    """One ProxyJump hop ([user@]host[:port]): its own ~/.ssh/config entry, the inventory's key and policy."""
    user, _, rest = spec.rpartition("@")
    if rest.startswith("["):
        name, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        name, _, port = rest.partition(":")
    found = options(name)
    files = (host.identity_file,) if host.identity_file else _files(found.get("identityfile"))
    return SshTarget(
        label=f"{host.name} (via jump {name})", alias=name, hostname=_first(found.get("hostname")) or name,
        port=int(port) if port else int(_first(found.get("port")) or 22),
        user=user or _first(found.get("user")) or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(f) for f in files),
        known_hosts=os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts"),
        host_key_policy=host.host_key_policy)


def with_config_addresses(inv: Inventory, options: Options) -> Inventory:
    """Fill each SSH host's missing `addr` from ~/.ssh/config's HostName, so an alias never becomes
    MASTER_ADDR (the other hosts could not resolve it)."""
    hosts = tuple(replace(h, addr=_first(options(h.host).get("hostname")) or h.host)
                  if h.connection == "ssh" and not h.addr else h for h in inv.hosts)
    return replace(inv, hosts=hosts)

