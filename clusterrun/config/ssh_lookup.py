"""One lookup as ssh.c main() makes it between reading the config and connecting: the command line's
values, the first pass, HostName's %h, the host lower-cased and canonicalized, the second pass where one is
due, the defaults, the jump-host loop check, and the tokens of IdentityFile, UserKnownHostsFile,
ProxyCommand and ProxyJump expanded as ssh expands them. `finish` also completes what `ssh -G` printed.

Pure given its inputs (see ssh_readconf.Context).
"""

from __future__ import annotations

import socket
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ConnectError, UsageError
from .ssh_readconf import PROXY_TOKENS, Context, NextHop, Options, Reader, Refused, Resolved, expand_hostname, \
    client_tokens
from .ssh_syntax import Jump, SyntaxProblem, default_port, match_pattern_list, parse_jump, percent_expand, tilde_expand, \
    valid_domain

DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
                      "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa")  # what ssh -G lists when none is set
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
SHELL_SAFE = "@%+=:,./-_[]"  # besides letters and digits: what `sh -c` leaves alone in a ProxyJump's words
ConfigFile = Tuple[str, bool, bool]  # (path, a user's file, must exist: `ssh -F`)


def _family(opts: Options) -> int:
    return {"inet": socket.AF_INET, "inet6": socket.AF_INET6}.get(opts.address_family or "", socket.AF_UNSPEC)


def is_addr_fast(name: str) -> bool:
    return "%" in name or ":" in name or all(c in "0123456789." for c in name)


def numeric_address(name: str, family: int) -> Optional[str]:
    """ssh.c resolve_addr: name as exactly one numeric address (`10.1` is 10.0.0.1), in canonical text."""
    try:
        found = socket.getaddrinfo(name, "22", family, socket.SOCK_STREAM, 0,
                                   socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)
        if len(found) != 1:
            return None
        return socket.getnameinfo(found[0][4], socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)[0]
    except (OSError, UnicodeError, ValueError):
        return None


class Canonical:
    """ssh.c resolve_canonicalize and check_follow_cname."""

    def __init__(self, ctx: Context, opts: Options):
        self.ctx, self.opts = ctx, opts
        self.needs = ""

    def lookup(self, name: str) -> Optional[Tuple[str, str]]:
        if self.ctx.resolve is None:
            where = self.opts.sources.get("canonicalizehostname") or self.opts.sources.get(
                "canonicalizepermittedcnames", "?")
            self.needs = self.needs or f"canonicalization (DNS) set at {where}"
            return None
        return self.ctx.resolve(name)

    def follow(self, direct: bool, name: str, cname: str) -> str:
        opts = self.opts
        if not cname or valid_domain(cname) or not opts.permits_cnames() or name == cname or opts.canonicalize == 0:
            return name
        if not direct and opts.canonicalize != 2:
            return name
        for source, target in opts.permitted_cnames or ():
            if match_pattern_list(name, source, True) == 1 and match_pattern_list(cname, target, True) == 1:
                return cname
        return name

    def canonicalize(self, host: str) -> Tuple[str, bool]:
        """(the host, whether it was found: an address, or a name in one of CanonicalDomains)."""
        opts = self.opts
        address = numeric_address(host, _family(opts))
        if address is not None:
            return (address if address.lower() != host.lower() else host), True
        direct = opts.direct()
        if is_addr_fast(host) or opts.canonicalize == 0 or (not direct and opts.canonicalize != 2):
            return host, False
        if not host.endswith(".") and host.count(".") > opts.max_dots:
            return host, False
        found = self.in_domains(host, direct)
        if found is not None:
            return found, True
        if not opts.fallback_local and not self.needs:
            raise ConnectError(self.ctx.alias, f'could not resolve host "{host}" in CanonicalDomains '
                                               f"{' '.join(opts.canonical_domains or ())} and "
                                               f"CanonicalizeFallbackLocal is no ({opts.sources.get('canonicalizefallbacklocal', '?')}), "
                                               "as ssh says")
        return host, False

    def in_domains(self, host: str, direct: bool) -> Optional[str]:
        """An anchored name (ending in a dot) as it is, else the name in each of CanonicalDomains in turn."""
        if host.endswith("."):
            found = self.lookup(host)
            return self.follow(direct, host[:-1], found[1]) if found else None
        for domain in self.opts.canonical_domains or ():
            if domain == "none":
                break
            found = self.lookup(f"{host}.{domain}.")
            if found:
                return self.follow(direct, f"{host}.{domain}", found[1])
        return None

    def cnames(self, host: str) -> str:
        """CanonicalizePermittedCNAMEs resolve the host even where nothing was canonicalized (ssh.c main)."""
        opts = self.opts
        if not opts.permits_cnames() or not (opts.direct() or opts.canonicalize == 2):
            return host
        found = self.lookup(host)
        if found is None:
            if opts.direct() and not self.needs:
                raise ConnectError(self.ctx.alias, f"could not resolve hostname {host}, as ssh says "
                                                   "(CanonicalizePermittedCNAMEs makes it look the name up)")
            return host
        return self.follow(opts.direct(), host, found[1])


def command_line(alias: str, user: Optional[str], port: Optional[int], jump: Optional[str]) -> Options:
    """The Options the inventory gives, as ssh's -l, -p and -J would (they come before every file)."""
    opts = Options()
    if user:
        opts.user, opts.sources["user"] = user, "inventory"
    if port:
        opts.port, opts.sources["port"] = int(port), "inventory"
    if jump:
        try:
            opts.jump = parse_jump(jump)
        except SyntaxProblem as exc:
            raise UsageError(f"{alias}: proxy_jump {jump!r}: {exc}") from None
        opts.sources["proxyjump"] = "inventory"
        if not opts.jump.none:
            opts.proxy_command = "none"
    return opts


def _pass(ctx: Context, opts: Options, host: str, final: bool, files: Sequence[ConfigFile]) -> Reader:
    reader = Reader(ctx, opts, host, final)
    for path, user, required in files:
        if not reader.file(path, [True], user, False, 0, checkperm=user and not required) and required:
            raise UsageError(f"ssh config {path}: cannot open it (as `ssh -F {path}` says: can't open user "
                             "config file)")
    return reader


def lookup(ctx: Context, opts: Options, files: Sequence[ConfigFile]) -> Resolved:
    first = _pass(ctx, opts, ctx.alias, False, files)
    for attr, default in (("max_dots", 1), ("fallback_local", 1), ("canonicalize", 0)):
        if getattr(opts, attr) == -1:
            setattr(opts, attr, default)
    host = ctx.alias
    if opts.hostname is not None:
        host = opts.hostname = expand_hostname(opts.hostname, host, opts.sources.get("hostname", "?"))
    family = _family(opts)
    was_addr = is_addr_fast(host) or numeric_address(host, family) is not None
    if not was_addr:
        host = host.lower()
    canon = Canonical(ctx, opts)
    found = False
    if opts.canonicalize != 0 or was_addr:
        host, found = canon.canonicalize(host)
    if not found:
        host = canon.cnames(host)
    needs = first.needs or canon.needs
    if first.want_final or opts.canonicalize != 0:
        opts.hostname = host
        needs = needs or _pass(ctx, opts, host, True, files).needs
    return finish(ctx, opts, host, needs)


def finish(ctx: Context, opts: Options, host: str, needs: str = "", known_expanded: bool = False) -> Resolved:
    """The defaults (ssh's fill_default_options), the jump-host loop check, and the values with their
    tokens expanded: what ssh connects with."""
    port = opts.port if opts.port > 0 else default_port()
    user = opts.user or ctx.local_user
    jump = None if opts.jump is None or opts.jump.none else opts.jump
    _no_self_jump(opts, jump, host, port, user)
    tokens = client_tokens(ctx, host, str(port), user, opts.host_key_alias or ctx.alias)
    values = {"hostname": (host,), "user": (user,), "port": (str(port),),
              "identitiesonly": ("yes" if opts.identities_only else "no",),
              "userknownhostsfile": _known_hosts(ctx, opts, tokens, known_expanded)}
    if opts.host_key_alias:
        values["hostkeyalias"] = (opts.host_key_alias,)
    identities = None
    if opts.identity_files:  # "none" counts as one (ssh adds no default keys then) and is dropped
        identities = values["identityfile"] = tuple(_path(ctx, raw, tokens, where, "identityfile")
                                                    for raw, where, _ in opts.identity_files if raw.lower() != "none")
    next_hop = _proxies(opts, jump, {k: v for k, v in tokens.items() if k in PROXY_TOKENS}, values)
    return Resolved(values, dict(opts.sources), needs, next_hop, identities)


def _no_self_jump(opts: Options, jump, host: str, port: int, user: str) -> None:
    """ssh.c: a ProxyJump to the very host, port and user is "jumphost loop via HOST"."""
    if jump is None or jump.host != host or user != (jump.user or user):
        return
    if port == (jump.port if jump.port > 0 else default_port()):
        raise Refused(opts.sources.get("proxyjump", "?"), "proxyjump", f"jumphost loop via {jump.host}")


def _proxies(opts: Options, jump, tokens, values: dict) -> Optional[NextHop]:
    """The ProxyCommand as it runs, or the jump host's nested ssh (into values; the next hop returned)."""
    proxy = opts.proxy_command
    if proxy is not None and proxy.lower() != "none":
        values["proxycommand"] = (_expand(proxy, tokens, opts.sources.get("proxycommand", "?"), "proxycommand"),)
    if not jump:
        return None
    values["proxyjump"] = (jump.printed(),)
    return _next_hop(jump, tokens, opts.sources.get("proxyjump", "?"))


def _known_hosts(ctx: Context, opts: Options, tokens, expanded: bool) -> Tuple[str, ...]:
    known = opts.known_hosts if opts.known_hosts is not None else list(DEFAULT_KNOWN_HOSTS)
    if expanded:
        return tuple(known)
    if known[:1] and known[0].lower() == "none":
        return ()
    where = opts.sources.get("userknownhostsfile", "?")
    return tuple(_path(ctx, k, tokens, where, "userknownhostsfile") for k in known)


def _next_hop(jump, tokens, where: str) -> NextHop:
    """ssh runs `ssh [-l USER] [-p PORT] [-J EXTRA] -W [%h]:%p HOST` through its ProxyCommand expansion and
    the shell, so the hop's words take ProxyCommand's tokens, and a word the shell would split or
    reinterpret is refused (ssh does not quote them)."""
    def x(text: Optional[str]) -> Optional[str]:
        if text is None:
            return None
        value = _expand(text, tokens, where, "proxyjump")
        odd = sorted({c for c in value if not (c.isalnum() or c in SHELL_SAFE)})
        if odd:
            raise Refused(where, "proxyjump", f"{value!r} (from {text!r}) holds {' '.join(map(repr, odd))}: ssh hands "
                                              "the jump's words to the shell unquoted, which would split or change "
                                              "them; clusterrun refuses it", ssh_too=False)
        return value

    return NextHop(x(jump.host), x(jump.user), jump.port if jump.port > 0 else None, x(jump.extra))


def _expand(text: str, tokens, where: str, keyword: str) -> str:
    try:
        return percent_expand(text, tokens)
    except SyntaxProblem as exc:
        raise Refused(where, keyword, f"{exc}; ssh fails on it when it connects", ssh_too=False) from None


def _path(ctx: Context, raw: str, tokens, where: str, keyword: str) -> str:
    if raw in ctx.expanded:
        return ctx.expanded[raw]
    try:
        return percent_expand(tilde_expand(raw, ctx.home), tokens, ctx.environ)
    except SyntaxProblem as exc:
        raise Refused(where, keyword, f"{raw}: {exc}; ssh fails on it when it connects", ssh_too=False) from None


def parse_ssh_g(output: str) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {}
    for raw in output.splitlines():
        key, _, rest = raw.partition(" ")  # a value's own trailing blanks are the value's ("~/.ssh/k ")
        found.setdefault(key.lower(), []).append(rest)
    return found


def to_expand(output: str) -> List[str]:
    """The IdentityFile values `ssh -G` printed that ssh expands later (tokens, ${VARS}, ~user)."""
    return [raw for raw in parse_ssh_g(output).get("identityfile", ())
            if "%" in raw or "${" in raw or (raw.startswith("~") and not raw.startswith("~/"))]


def from_ssh_g(ctx: Context, output: str, ours: Resolved) -> Resolved:
    """What `ssh -G` printed, completed as ssh completes it when it connects (identity files' tokens, where
    ctx.expanded does not already hold ssh's own expansion; the ProxyCommand's; the jump's words); sources
    kept from clusterrun's own reading where it agrees."""
    found = parse_ssh_g(output)
    opts = Options(hostname=found["hostname"][0], user=found["user"][0], port=int(found["port"][0]))
    raw_ids: List[str] = found.get("identityfile", [])
    if tuple(raw_ids) != DEFAULT_IDENTITIES:
        opts.identity_files = [(r, "ssh -G", True) for r in raw_ids]
    opts.host_key_alias = (found.get("hostkeyalias") or [None])[0]
    opts.proxy_command = (found.get("proxycommand") or [None])[0]
    opts.identities_only = (found.get("identitiesonly") or ["no"])[0] == "yes"
    opts.known_hosts = (found.get("userknownhostsfile") or [""])[0].split()
    if found.get("proxyjump"):  # a printed "none" is a host of that name: ssh drops ProxyJump none before -G
        printed = found["proxyjump"][0]
        opts.jump = Jump(None, printed, -1) if printed.lower() == "none" else parse_jump(printed)
    for key in ("hostname", "user", "port", "identityfile", "proxycommand", "proxyjump", "userknownhostsfile"):
        opts.sources[key] = ours.sources.get(key, "ssh -G")  # file:line in messages where the own reading knows it
    done = finish(ctx, opts, opts.hostname, known_expanded=True)
    sources = {}
    for key, value in done.values.items():
        if ours.values.get(key) != value:
            sources[key] = "ssh -G"
        elif key in ours.sources:
            sources[key] = ours.sources[key]
    return Resolved(done.values, sources, "", done.jump, done.identities)
