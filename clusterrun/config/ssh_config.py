"""Where and how to reach an SSH host, as OpenSSH would: the inventory's values over ~/.ssh/config's (and
/etc/ssh/ssh_config's), as a `SshTarget` that remembers where each value came from.

The config is read exactly as OpenSSH 9.2's client reads it (ssh_readconf.py, ssh_lookup.py: every
keyword, Host and Match, Include, canonicalization, the second pass, tokens); where an OpenSSH client is
installed, transport/openssh.py asks `ssh -G` instead and completes its answer the same way. The jump
hosts are followed as ssh follows them: for `ProxyJump A,B` ssh connects to B through `ssh -J A B`, so B's
own ProxyJump and ProxyCommand do not apply and A's do (its own jumps come first). docs/ssh-config.md
lists where clusterrun deliberately does otherwise.

Pure given its files: reads them, never connects; `Match exec` and name lookups only through the
functions it is given.
"""

from __future__ import annotations

import getpass
import os
import pwd
import socket
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional, Sequence, Tuple

from ..errors import UsageError
from .inventory import Host, Inventory
from .ssh_lookup import ConfigFile, command_line, from_ssh_g, lookup, to_expand
from .ssh_readconf import MAX_INCLUDE_DEPTH, Context, NextHop, Resolved
from .ssh_syntax import Resolver, match_pattern_list

__all__ = ["MAX_INCLUDE_DEPTH", "NextHop", "Resolved", "SshTarget", "config_files", "from_openssh", "match_list",
           "read_config", "ssh_target", "to_expand", "with_config_addresses"]

USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
CONFIG_ENV = "CLUSTERRUN_SSH_CONFIG"  # one file instead of both, as `ssh -F FILE` reads it
MAX_HOPS = 16

Options = Callable[..., Resolved]  # options(alias, user=None, port=None, jump=None) -> Resolved


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
    jumps: Tuple["SshTarget", ...] = ()  # the jump hosts, first hop first (only the first may have a proxy_command)
    proxy_command: Optional[str] = None  # tokens expanded; run as `sh -c "exec COMMAND"`
    identities_only: bool = False  # IdentitiesOnly: no keys from ssh-agent beyond the identity files
    identity_explicit: bool = False  # an IdentityFile was named (inventory or config): no default keys
    sources: Mapping[str, str] = field(default_factory=dict)  # value -> where it came from

    def to_json(self) -> dict:
        return {"hostname": self.hostname, "port": self.port, "user": self.user,
                "identity_files": list(self.identity_files), "known_hosts": self.known_hosts,
                "proxy_jump": [f"{j.user}@{j.hostname}:{j.port}" for j in self.jumps],
                "proxy_command": self.proxy_command or (self.jumps[0].proxy_command if self.jumps else None),
                "sources": dict(self.sources)}

    def provenance(self) -> str:
        """One line for --dry-run and check: each value and where it came from."""
        first_proxy = self.jumps[0].proxy_command if self.jumps else None
        shown = (("hostname", self.hostname), ("user", self.user), ("port", str(self.port)),
                 ("identity", ", ".join(self.identity_files) or
                  ("ssh-agent only" if self.identity_explicit else "default keys, ssh-agent")),
                 ("proxyjump", " -> ".join(f"{j.user}@{j.hostname}:{j.port}" for j in self.jumps)),
                 ("proxycommand", self.proxy_command or (f"{first_proxy} (to reach the first jump)"
                                                         if first_proxy else "")),
                 ("known_hosts", self.known_hosts))
        sources = dict(self.sources)
        if first_proxy:
            sources["proxycommand"] = self.jumps[0].sources.get("proxycommand", "default")
        return "; ".join(f"{key} {value} ({sources.get(key, 'default')})" for key, value in shown if value)


def match_list(value: str, patterns: Sequence[str]) -> bool:
    """OpenSSH's pattern lists (Match's): some pattern matches, case-insensitively, and no negated (!) one."""
    return any(match_pattern_list(value.lower(), p, True) == 1 for p in patterns) and \
        not any(match_pattern_list(value.lower(), p, True) == -1 for p in patterns)


# ------------------------------------------------------------------ reading


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        return fh.read()


def config_files(environ: Mapping[str, str] = os.environ) -> Tuple[Tuple[str, bool], ...]:
    """(path, is the system's) of the files to read: $CLUSTERRUN_SSH_CONFIG alone (like `ssh -F`), else
    ~/.ssh/config then /etc/ssh/ssh_config."""
    if environ.get(CONFIG_ENV):
        return ((environ[CONFIG_ENV], False),)
    return ((USER_CONFIG, False), (SYSTEM_CONFIG, True))


def local_user() -> str:
    """Who ssh is: the account's name (not $USER)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return getpass.getuser()


def context(alias: str, *, local: Optional[str] = None, home: Optional[str] = None,
            read: Callable[[str], str] = _read_text, run_exec: Optional[Callable[[str], int]] = None,
            resolve: Optional[Resolver] = None, environ: Optional[Mapping[str, str]] = None) -> Context:
    return Context(alias=alias, local_user=local or local_user(), home=home or os.path.expanduser("~"),
                   environ=os.environ if environ is None else environ, read=read, run_exec=run_exec,
                   resolve=resolve, thishost=socket.gethostname(), uid=os.getuid())


def read_config(alias: str, *, user: Optional[str] = None, port: Optional[int] = None, jump: Optional[str] = None,
                files: Optional[Sequence[Tuple[str, bool]]] = None, read: Callable[[str], str] = _read_text,
                local_user: Optional[str] = None, home: Optional[str] = None,
                run_exec: Optional[Callable[[str], int]] = None, resolve: Optional[Resolver] = None) -> Resolved:
    """The options for alias from the SSH config files (user's first, then the system's), as OpenSSH
    evaluates them; the inventory's user, port and proxy_jump take part as `ssh -l -p -J` would. Without
    run_exec (Match exec) or resolve (canonicalization), what needs them is named in `needs_openssh`."""
    ctx = context(alias, local=local_user, home=home, read=read, run_exec=run_exec, resolve=resolve)
    chosen = config_files() if files is None else files
    forced = files is None and bool(os.environ.get(CONFIG_ENV))
    paths: Sequence[ConfigFile] = [(ctx.home + p[1:] if p.startswith("~/") else p, not system, forced)
                                   for p, system in chosen]
    return lookup(ctx, command_line(alias, user, port, jump), paths)


def from_openssh(output: str, alias: str, ours: Resolved, *, local_user: Optional[str] = None,
                 home: Optional[str] = None, expanded: Optional[Mapping[str, str]] = None) -> Resolved:
    """The options `ssh -G ALIAS` printed, completed as ssh completes them when it connects (expanded: the
    IdentityFile values ssh itself expanded); where a value is what clusterrun's own reading found, its
    source is kept, else the source is "ssh -G"."""
    ssh_home = home or pwd.getpwuid(os.getuid()).pw_dir  # ssh's ~ is the account's home
    ctx = replace(context(alias, local=local_user, home=ssh_home), expanded=dict(expanded or {}))
    return from_ssh_g(ctx, output, ours)


# ------------------------------------------------------------------ targets


def ssh_target(host: Host, options: Options) -> SshTarget:
    """The target for an inventory host; inventory values win over the SSH config's."""
    return _target(host, options, host.host, host.user, host.port, host.proxy_jump, host.name, ())


def _target(host: Host, options: Options, alias: str, user: Optional[str], port: Optional[int],
            jump: Optional[str], label: str, stack: Tuple[Tuple, ...]) -> SshTarget:
    found = options(alias, user=user, port=port, jump=jump)
    hops: Tuple[SshTarget, ...] = ()
    if found.jump is not None:
        nxt = found.jump
        step = stack + ((alias, user, port, jump, found.sources.get("proxyjump", "?")),)
        if (nxt.host, nxt.user, nxt.port, nxt.extra) in [s[:4] for s in step] or len(step) >= MAX_HOPS:
            chain = " -> ".join(f"{s[0]} (ProxyJump at {s[4]})" for s in step) + f" -> {nxt.host}"
            raise UsageError(f"{host.name}: the jump hosts lead back to themselves: {chain}; ssh would start ssh "
                             "without end; break the loop in the SSH config")
        first = _target(host, options, nxt.host, nxt.user, nxt.port, nxt.extra,
                        f"{host.name} (via jump {nxt.host})", step)
        hops = first.jumps + (replace(first, jumps=()),)
    inventory_key = bool(host.identity_file)
    return SshTarget(
        label=label, alias=alias, hostname=found.get("hostname") or alias,
        port=int(found.get("port") or 22), user=found.get("user") or local_user(),
        identity_files=(os.path.expanduser(host.identity_file),) if inventory_key else (found.identities or ()),
        known_hosts=os.path.expanduser(host.known_hosts or (found.values.get("userknownhostsfile") or
                                                            ("~/.ssh/known_hosts",))[0]),
        host_key_policy=host.host_key_policy, jumps=hops,
        proxy_command=None if hops else found.get("proxycommand"),
        identities_only=found.get("identitiesonly") == "yes",
        identity_explicit=inventory_key or found.identities is not None,
        sources=_sources(host, found))


def _sources(host: Host, found: Resolved) -> dict:
    """Where each of the target's values came from: the inventory, or the SSH config's file:line."""
    sources = {k: v if v in ("inventory", "ssh -G") else f"ssh config {v}" for k, v in found.sources.items()}
    if host.identity_file:
        sources["identity"] = "inventory"
    elif "identityfile" in sources:
        sources["identity"] = sources.pop("identityfile")
    if host.known_hosts:
        sources["known_hosts"] = "inventory"
    elif "userknownhostsfile" in sources:
        sources["known_hosts"] = sources.pop("userknownhostsfile")
    return sources


def with_config_addresses(inv: Inventory, options: Options) -> Inventory:
    """Fill each SSH host's missing `addr` from the SSH config's HostName, so an alias never becomes
    MASTER_ADDR (the other hosts could not resolve it). Such a host's whole target (its jumps too) is worked
    out here, so a config ssh would refuse stops the command before anything connects."""
    hosts = tuple(replace(h, addr=ssh_target(h, options).hostname) if h.connection == "ssh" and not h.addr else h
                  for h in inv.hosts)
    return replace(inv, hosts=hosts)
