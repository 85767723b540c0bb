"""Where and how to reach an SSH host, as OpenSSH would: the inventory's values over ~/.ssh/config's
(and /etc/ssh/ssh_config's), as a `SshTarget` that remembers where each value came from.

The config is read the way OpenSSH reads it: `Include` (globs; relative to ~/.ssh or /etc/ssh; inside a
Host or Match block it is conditional), `Host` patterns with `*`, `?` and `!`, `Match` (all, host,
originalhost, user, localuser), the first obtained value of a keyword wins (IdentityFile accumulates),
and the tokens (%h %p %r %u %n %d %l %L %i %%) in HostName, IdentityFile, ProxyCommand and User.
What only OpenSSH can evaluate (`Match exec`, `canonical`, `final`, `localnetwork`, `tagged`) is flagged
in `Resolved.needs_openssh`: the transport then asks `ssh -G` (transport/openssh.py) for the values.

Pure given its files: reads them, never connects, runs nothing.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
import socket
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import UsageError
from .inventory import Host, Inventory

USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
CONFIG_ENV = "CLUSTERRUN_SSH_CONFIG"  # one file instead of both, as `ssh -F FILE` reads it
# What clusterrun takes from an SSH config (everything else is OpenSSH's business).
KEYS = ("hostname", "user", "port", "identityfile", "identitiesonly", "proxyjump", "proxycommand",
        "userknownhostsfile")
MULTI = ("identityfile",)
MAX_INCLUDE_DEPTH = 16


@dataclass(frozen=True)
class Resolved:
    """The options that apply to one alias: keyword → values, and keyword → where its value came from."""

    values: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    needs_openssh: str = ""  # why only `ssh -G` can say ("" when this reading is complete)

    def get(self, key: str) -> Optional[str]:
        found = self.values.get(key)
        return found[0] if found else None


Options = Callable[..., Resolved]  # options(alias, user=None, port=None) -> Resolved


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
    identities_only: bool = False  # IdentitiesOnly: no keys from ssh-agent beyond the identity files
    identity_explicit: bool = False  # an IdentityFile was named (inventory or config): it must load
    sources: Mapping[str, str] = field(default_factory=dict)  # value -> where it came from

    def to_json(self) -> dict:
        return {"hostname": self.hostname, "port": self.port, "user": self.user,
                "identity_files": list(self.identity_files), "known_hosts": self.known_hosts,
                "proxy_jump": [f"{j.user}@{j.hostname}:{j.port}" for j in self.jumps],
                "proxy_command": self.proxy_command, "sources": dict(self.sources)}

    def provenance(self) -> str:
        """One line for --dry-run and check: each value and where it came from."""
        shown = (("hostname", self.hostname), ("user", self.user), ("port", str(self.port)),
                 ("identity", ", ".join(self.identity_files) or "default keys, ssh-agent"),
                 ("proxyjump", " -> ".join(f"{j.user}@{j.hostname}:{j.port}" for j in self.jumps)),
                 ("proxycommand", self.proxy_command or ""), ("known_hosts", self.known_hosts))
        return "; ".join(f"{key} {value} ({self.sources.get(key, 'default')})" for key, value in shown if value)


# ------------------------------------------------------------------ reading the files


@dataclass(frozen=True)
class _Line:
    keyword: str  # lower case
    args: Tuple[str, ...]
    where: str  # file:line


def _split(text: str, where: str) -> Optional[_Line]:
    line = text.strip()
    if not line or line.startswith("#"):
        return None
    m = re.match(r"^(\S+?)(?:\s*=\s*|\s+)(.*)$", line)
    if not m:
        return _Line(line.lower(), (), where)
    try:
        args = tuple(shlex.split(m.group(2), comments=True))
    except ValueError:  # an unbalanced quote: take the words as they are
        args = tuple(m.group(2).split())
    return _Line(m.group(1).lower(), args, where)


def _pattern_match(value: str, pattern: str) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.IGNORECASE) is not None


def match_list(value: str, patterns: Sequence[str]) -> bool:
    """OpenSSH's pattern lists: some pattern matches and no negated (!) one does."""
    positive = False
    for item in (p for arg in patterns for p in arg.split(",") if p):
        if item.startswith("!"):
            if _pattern_match(value, item[1:]):
                return False
        elif _pattern_match(value, item):
            positive = True
    return positive


class _Reader:
    """One lookup: walks the files in OpenSSH's order, keeping the first value of each keyword."""

    def __init__(self, alias: str, user: Optional[str], port: Optional[int], local_user: str, home: str,
                 read: Callable[[str], str]):
        self.alias = alias.lower()
        self.local_user = local_user
        self.home = home
        self.read = read
        self.values: Dict[str, List[str]] = {}
        self.sources: Dict[str, str] = {}
        self.needs_openssh = ""
        self.reading: List[str] = []  # the files being read, outermost first (Include nests them)
        if user:
            self.values["user"], self.sources["user"] = [user], "inventory"
        if port:
            self.values["port"], self.sources["port"] = [str(port)], "inventory"

    def file(self, path: str, active: bool, never: bool, depth: int, system: bool) -> None:
        try:
            text = self.read(path)
        except OSError:
            return
        self.reading.append(os.path.realpath(path))
        try:
            self._lines(path, text, active, never, depth, system)
        finally:
            self.reading.pop()

    def _lines(self, path: str, text: str, active: bool, never: bool, depth: int, system: bool) -> None:
        for number, raw in enumerate(text.splitlines(), 1):
            line = _split(raw, f"{path}:{number}")
            if line is None:
                continue
            if line.keyword == "host":
                active = not never and match_list(self.alias, line.args)
            elif line.keyword == "match":
                active = not never and self.match(line)
            elif line.keyword == "include":
                self.include(line, active, never or not active, depth, system)
            elif active:
                self.take(line)

    def include(self, line: _Line, active: bool, never: bool, depth: int, system: bool) -> None:
        """As OpenSSH: files nest at most MAX_INCLUDE_DEPTH deep, deeper is an error that stops everything
        ("Too many recursive configuration includes"); a file that includes one already being read is
        that error at once (no file is read twice in one chain, so a loop costs nothing)."""
        for arg in line.args:
            path = os.path.expanduser(arg)
            if not os.path.isabs(path):
                path = os.path.join("/etc/ssh" if system else os.path.join(self.home, ".ssh"), path)
            for found in sorted(glob.glob(path)):
                if os.path.realpath(found) in self.reading:
                    raise UsageError(f"{line.where}: Include {arg}: {found} includes itself (through "
                                     f"{' > '.join(self.reading)}): too many recursive configuration includes, "
                                     "as ssh says; remove the loop")
                if depth + 1 > MAX_INCLUDE_DEPTH:
                    raise UsageError(f"{line.where}: Include {arg}: too many recursive configuration includes "
                                     f"(more than {MAX_INCLUDE_DEPTH} files deep, where ssh stops too)")
                self.file(found, active, never, depth + 1, system)

    def match(self, line: _Line) -> bool:
        """Match criteria, ANDed; the ones only OpenSSH can evaluate mark the lookup as needing ssh -G."""
        args = list(line.args)
        result = True
        while args:
            word = args.pop(0).lower()
            negate = word.startswith("!")
            word = word.lstrip("!")
            if word == "all":
                ok = True
            elif word in ("host", "originalhost", "user", "localuser") and args:
                value = {"host": (self.values.get("hostname") or [self.alias])[0],
                         "originalhost": self.alias, "user": (self.values.get("user") or [self.local_user])[0],
                         "localuser": self.local_user}[word]
                ok = match_list(_expand(value, self._tokens()) if word == "host" else value, [args.pop(0)])
            else:  # exec, canonical, final, localnetwork, tagged: OpenSSH's own business
                self.needs_openssh = self.needs_openssh or f"Match {word} at {line.where}"
                if word in ("exec", "localnetwork", "tagged") and args:
                    args.pop(0)
                ok = False
            result = result and (ok != negate)
        return result

    def take(self, line: _Line) -> None:
        key = line.keyword
        if key not in KEYS or not line.args:
            return
        if key in ("proxyjump", "proxycommand") and ({"proxyjump", "proxycommand"} & set(self.values)):
            return  # the two exclude each other: the first given wins
        if key in MULTI:
            if line.args[0].lower() != "none":
                self.values.setdefault(key, []).append(line.args[0])
                self.sources.setdefault(key, line.where)
            return
        if key not in self.values:
            self.values[key] = [" ".join(line.args)] if key == "proxycommand" else list(line.args)
            self.sources[key] = line.where

    def _tokens(self) -> Dict[str, str]:
        hostname = (self.values.get("hostname") or [self.alias])[0].replace("%h", self.alias)
        return {"h": hostname, "n": self.alias, "p": (self.values.get("port") or ["22"])[0],
                "r": (self.values.get("user") or [self.local_user])[0], "u": self.local_user, "d": self.home,
                "l": socket.gethostname().split(".")[0], "L": socket.gethostname(), "i": str(os.getuid())}

    def resolved(self) -> Resolved:
        tokens = self._tokens()
        values = {}
        for key, vals in self.values.items():
            if key in ("hostname", "identityfile", "proxycommand", "user", "userknownhostsfile"):
                vals = [_expand(v, tokens) for v in vals]
            if key in ("identityfile", "userknownhostsfile"):
                vals = [os.path.expanduser(v) if not v.startswith("~/") else os.path.join(self.home, v[2:])
                        for v in vals]
            values[key] = tuple(vals)
        return Resolved(values, dict(self.sources), self.needs_openssh)


def _expand(text: str, tokens: Mapping[str, str]) -> str:
    return re.sub(r"%(.)", lambda m: "%" if m.group(1) == "%" else tokens.get(m.group(1), m.group(0)), text)


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def config_files(environ: Mapping[str, str] = os.environ) -> Tuple[Tuple[str, bool], ...]:
    """(path, is the system's) of the files to read: $CLUSTERRUN_SSH_CONFIG alone (like `ssh -F`), else
    ~/.ssh/config then /etc/ssh/ssh_config."""
    if environ.get(CONFIG_ENV):
        return ((environ[CONFIG_ENV], False),)
    return ((USER_CONFIG, False), (SYSTEM_CONFIG, True))


def read_config(alias: str, *, user: Optional[str] = None, port: Optional[int] = None,
                files: Optional[Sequence[Tuple[str, bool]]] = None, read: Callable[[str], str] = _read_text,
                local_user: Optional[str] = None, home: Optional[str] = None) -> Resolved:
    """The options for alias from the SSH config files (user's first, then the system's), as OpenSSH
    evaluates them; the inventory's user and port (when given) take part in Match, as `ssh -l -p` would."""
    files = config_files() if files is None else files
    home = home or os.path.expanduser("~")
    reader = _Reader(alias, user, port, local_user or getpass.getuser(), home, read)
    for path, system in files:
        reader.file(os.path.expanduser(path) if not path.startswith("~/") else os.path.join(home, path[2:]),
                    True, False, 0, system)
    return reader.resolved()



def from_openssh(output: str, alias: str, ours: Resolved, *, local_user: Optional[str] = None,
                 home: Optional[str] = None) -> Resolved:
    """The options `ssh -G ALIAS` printed (lower-case keywords, tokens unexpanded), for KEYS; where a value
    is what this module's own reading found, its source is kept, else the source is "ssh -G"."""
    found: Dict[str, List[str]] = {}
    for raw in output.splitlines():
        key, _, rest = raw.strip().partition(" ")
        key = key.lower()
        if key in KEYS and rest:
            found.setdefault(key, []).append(rest)
    if "identityfile" not in ours.values:
        found.pop("identityfile", None)  # ssh -G lists OpenSSH's default keys: clusterrun has its own
    for key in ("userknownhostsfile",):
        if key in found:
            found[key] = found[key][0].split()[:1]
    home = home or os.path.expanduser("~")
    reader = _Reader(alias, None, None, local_user or getpass.getuser(), home, _read_text)
    reader.values = found
    expanded = reader.resolved().values
    sources = {key: ours.sources[key] if ours.values.get(key) == value and key in ours.sources else "ssh -G"
               for key, value in expanded.items() if key in ours.sources or key not in ("user", "port")}
    return Resolved(expanded, sources, "")


# ------------------------------------------------------------------ targets


def _word(resolved: Resolved, key: str) -> Optional[str]:
    value = resolved.get(key)
    return None if value is None or value.lower() == "none" else value


def ssh_target(host: Host, options: Options) -> SshTarget:
    """The target for an inventory host; inventory values win over the SSH config's."""
    found = options(host.host, user=host.user, port=host.port)
    jump = host.proxy_jump or _word(found, "proxyjump")
    return SshTarget(
        label=host.name, alias=host.host, hostname=found.get("hostname") or host.host,
        port=host.port or int(found.get("port") or 22), user=host.user or found.get("user") or getpass.getuser(),
        identity_files=_identity_files(host, found), known_hosts=os.path.expanduser(_known_hosts(host, found)),
        host_key_policy=host.host_key_policy,
        jumps=() if jump is None else tuple(_jump(spec, host, options) for spec in jump.split(",")),
        proxy_command=None if host.proxy_jump else _word(found, "proxycommand"),
        identities_only=_identities_only(found), identity_explicit=_identity_explicit(host, found),
        sources=_sources(host, found))


def _sources(host: Host, found: Resolved) -> Dict[str, str]:
    """Where each of the target's values came from: the inventory, or the SSH config's file:line."""
    sources = {k: f"ssh config {v}" if ":" in v and v != "inventory" else v for k, v in found.sources.items()}
    if host.proxy_jump:
        sources["proxyjump"] = "inventory"
    if host.identity_file:
        sources["identity"] = "inventory"
    elif "identityfile" in sources:
        sources["identity"] = sources.pop("identityfile")
    if host.known_hosts:
        sources["known_hosts"] = "inventory"
    elif "userknownhostsfile" in sources:
        sources["known_hosts"] = sources.pop("userknownhostsfile")
    return sources


def _identity_files(host: Host, found: Resolved) -> Tuple[str, ...]:
    """The inventory's key alone where it names one, else every IdentityFile of the SSH config."""
    if host.identity_file:
        return (os.path.expanduser(host.identity_file),)
    return tuple(found.values.get("identityfile", ()))


def _known_hosts(host: Host, found: Resolved) -> str:
    return host.known_hosts or (found.values.get("userknownhostsfile") or ("~/.ssh/known_hosts",))[0]


def _identities_only(found: Resolved) -> bool:
    return (found.get("identitiesonly") or "no").lower() == "yes"


def _identity_explicit(host: Host, found: Resolved) -> bool:
    """A key was named (inventory or SSH config), rather than left to the defaults."""
    return bool(host.identity_file or found.sources.get("identityfile"))


def _jump(spec: str, host: Host, options: Options) -> SshTarget:
    """One ProxyJump hop ([user@]host[:port]): its own SSH config entry, the inventory's key and policy."""
    user, _, rest = spec.rpartition("@")
    if rest.startswith("["):
        name, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        name, _, port = rest.partition(":")
    found = options(name, user=user or None, port=int(port) if port else None)
    return SshTarget(
        label=f"{host.name} (via jump {name})", alias=name, hostname=found.get("hostname") or name,
        port=int(port) if port else int(found.get("port") or 22),
        user=user or found.get("user") or getpass.getuser(), identity_files=_identity_files(host, found),
        known_hosts=os.path.expanduser(_known_hosts(host, found)),
        host_key_policy=host.host_key_policy, identities_only=_identities_only(found),
        identity_explicit=_identity_explicit(host, found),
        sources={"identity": "inventory"} if host.identity_file else {})


def with_config_addresses(inv: Inventory, options: Options) -> Inventory:
    """Fill each SSH host's missing `addr` from the SSH config's HostName, so an alias never becomes
    MASTER_ADDR (the other hosts could not resolve it)."""
    hosts = tuple(replace(h, addr=options(h.host, user=h.user, port=h.port).get("hostname") or h.host)
                  if h.connection == "ssh" and not h.addr else h for h in inv.hosts)
    return replace(inv, hosts=hosts)
