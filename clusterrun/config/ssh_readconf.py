"""~/.ssh/config read as OpenSSH 9.2's client reads it (readconf.c, and the part of ssh.c main() between
reading the config and connecting), for the values clusterrun uses; every other keyword's value is checked
as ssh checks it (ssh_keywords.py), so a config ssh refuses is refused here, naming file:line and keyword.

One lookup (ssh.c's order): the command line's values (the inventory's user, port, proxy_jump as -l, -p,
-J) first, then the files; HostName's %h; the host lower-cased (unless an address), canonicalized (numeric
addresses always; names with CanonicalizeHostname, trying CanonicalDomains through the given resolver, CNAMEs
by CanonicalizePermittedCNAMEs); then, when canonicalization is on or a `Match final` was seen, a second
pass over the files in which `Host` matches the new host name and `Match canonical`/`final` match; the
defaults; then IdentityFile, UserKnownHostsFile, ProxyCommand and ProxyJump tokens expanded as ssh expands
them when it connects.

Pure given its inputs: files are read through `read`, `Match exec` runs through `run_exec` and names resolve
through `resolve`; where either is not given, what needs it is noted in `Resolved.needs_openssh` instead.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..errors import UsageError
from .ssh_keywords import CHECKS, KEYWORDS, MULTISTATE, check_value
from .ssh_syntax import (WHITESPACE, Jump, Resolver, SyntaxProblem, a2port, argv_split, default_port,
                         match_hostname, match_pattern, match_pattern_list, parse_jump, percent_expand, strdelim,
                         strtonum)

MAX_INCLUDE_DEPTH = 16
CANON_VALUES = {"true": 1, "yes": 1, "false": 0, "no": 0, "always": 2}
STRINGS = {"hostname": "hostname", "user": "user", "hostkeyalias": "host_key_alias", "ignoreunknown": "ignored_unknown"}
STATES = {"identitiesonly": ("identities_only", "flag"), "canonicalizefallbacklocal": ("fallback_local", "flag"),
          "canonicalizehostname": ("canonicalize", "canonicalize"), "addressfamily": ("address_family", "addressfamily")}
PROXY_TOKENS = "hknpr"  # what sshconnect.c expand_proxy_command knows (ProxyCommand, and ProxyJump's command)


class Refused(UsageError):
    """An SSH config line ssh refuses (or clusterrun does, on purpose): file:line, keyword, why."""

    def __init__(self, where: str, keyword: str, why: str, *, ssh_too: bool = True):
        self.where, self.keyword, self.why = where, keyword, why
        tail = "; ssh refuses this config too" if ssh_too else ""
        place = "ssh config (as `ssh -G` prints it)" if where == "ssh -G" else f"ssh config {where}"
        super().__init__(f"{place}: {keyword}: {why}{tail}")


@dataclass(frozen=True)
class NextHop:
    """The jump host ssh connects through first, as the `ssh -J EXTRA -l USER -p PORT HOST` it would run."""

    host: str
    user: Optional[str] = None
    port: Optional[int] = None
    extra: Optional[str] = None  # the hops before it, as ssh passes them on (-J)


@dataclass(frozen=True)
class Resolved:
    """The options that apply to one lookup: keyword -> values, and keyword -> where each came from."""

    values: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    needs_openssh: str = ""  # what only ssh (or a command, or DNS) could say ("" when this reading is complete)
    jump: Optional[NextHop] = None
    identities: Optional[Tuple[str, ...]] = None  # IdentityFile, expanded; None: none configured (defaults)

    def get(self, key: str) -> Optional[str]:
        found = self.values.get(key)
        return found[0] if found else None


@dataclass
class Options:
    """ssh's Options, the part clusterrun needs: None (or -1) is unset, and the first value set wins."""

    hostname: Optional[str] = None
    user: Optional[str] = None
    port: int = -1
    host_key_alias: Optional[str] = None
    proxy_command: Optional[str] = None
    jump: Optional[Jump] = None
    identity_files: List[Tuple[str, str, bool]] = field(default_factory=list)  # (as written, where, user's file)
    known_hosts: Optional[List[str]] = None
    identities_only: Optional[bool] = None
    address_family: Optional[str] = None
    canonicalize: int = -1
    canonical_domains: Optional[List[str]] = None
    max_dots: int = -1
    fallback_local: int = -1
    permitted_cnames: Optional[List[Tuple[str, str]]] = None
    ignored_unknown: Optional[str] = None
    sources: Dict[str, str] = field(default_factory=dict)

    def permits_cnames(self) -> bool:
        return bool(self.permitted_cnames) and self.permitted_cnames != [("none", "")]

    def direct(self) -> bool:
        return (self.proxy_command is None or self.proxy_command.lower() == "none") and self.jump is None


@dataclass(frozen=True)
class Context:
    """What one lookup knows of this machine and its user."""

    alias: str
    local_user: str
    home: str
    environ: Mapping[str, str]
    read: Callable[[str], str]
    run_exec: Optional[Callable[[str], int]] = None
    resolve: Optional[Resolver] = None
    thishost: str = ""
    uid: int = 0
    expanded: Mapping[str, str] = field(default_factory=dict)  # IdentityFile as written -> as ssh itself expanded it


def _set(opts: Options, attr: str, value, where: str, key: str) -> None:
    if getattr(opts, attr) in (None, -1):
        setattr(opts, attr, value)
        opts.sources.setdefault(key, where)


@lru_cache(maxsize=4096)
def _tokens(text: str) -> Optional[Tuple[str, str, Optional[Tuple[str, ...]]]]:
    """A config line split as readconf.c splits it: its keyword (lower-cased), the rest, and the rest's words
    (None: a quote is not closed); None for a blank line or a comment. Pure, so each distinct line is split
    once per process: a launch looks every host up in the same files (0.7 ms a host, before)."""
    keyword, rest = strdelim(text.rstrip(WHITESPACE + "\f") or text[:1])
    if keyword == "":
        keyword, rest = strdelim(rest)
    if not keyword or keyword.startswith("#"):
        return None
    rest = rest.lstrip(WHITESPACE) if rest is not None else ""
    words = argv_split(rest) if rest else []
    return keyword.lower(), rest, tuple(words) if words is not None else None


class Reader:
    """One pass over the files (readconf.c read_config_file and process_config_line)."""

    def __init__(self, ctx: Context, opts: Options, host: str, final: bool):
        self.ctx, self.opts, self.host, self.final = ctx, opts, host, final
        self.want_final = False
        self.needs = ""
        self.reading: List[str] = []

    def file(self, path: str, active: List[bool], user: bool, never: bool, depth: int, checkperm: bool = True) -> bool:
        """Read one file; False when it does not exist. As ssh: a user's files (and every included one) must
        be owned by the user or root and writable by no one else."""
        if depth > MAX_INCLUDE_DEPTH:
            raise UsageError(f"ssh config {path}: too many recursive configuration includes (more than "
                             f"{MAX_INCLUDE_DEPTH} files deep, where ssh stops too)")
        try:
            text = self.ctx.read(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise UsageError(f"ssh config {path}: cannot read it: {exc.strerror or exc}") from None
        if checkperm:
            _check_owner(path)
        self.reading.append(os.path.realpath(path))
        try:
            lines = text.split("\n")
            for number, line in enumerate(lines[:-1] if lines and lines[-1] == "" else lines, 1):
                self.line(line, f"{path}:{number}", active, user, never, depth)
        finally:
            self.reading.pop()
        return True

    def line(self, text: str, where: str, active: List[bool], user: bool, never: bool, depth: int) -> None:
        split = _tokens(text)
        if split is None:
            return
        keyword, rest, split_words = split
        if not rest:
            raise Refused(where, keyword, "no argument after keyword")
        if keyword not in KEYWORDS:
            ignored = self.opts.ignored_unknown
            if ignored is None or match_pattern_list(keyword, ignored, True) != 1:
                raise Refused(where, keyword, "Bad configuration option (a keyword OpenSSH 9.2 does not know; "
                                              "IgnoreUnknown lists the ones to pass over)")
        if split_words is None:
            raise Refused(where, keyword, "invalid quotes")
        if keyword not in KEYWORDS:
            return
        words = list(split_words)
        try:
            used = self.keyword(keyword, words, rest, where, active, user, never, depth)
        except SyntaxProblem as exc:
            raise Refused(where, keyword, str(exc)) from None
        if used < len(words):
            raise Refused(where, keyword, f"extra arguments at end of line ({' '.join(words[used:])})")

    def keyword(self, keyword: str, words: List[str], rest: str, where: str, active: List[bool], user: bool,
                never: bool, depth: int) -> int:
        if keyword == "host":
            return self.host_line(words, active, never)
        if keyword == "match":
            return self.match_line(rest, where, active, never, len(words))
        if keyword == "include":
            return self.include(words, where, active, user, never, depth)
        if KEYWORDS[keyword] != "reader":
            return check_value(keyword, words, rest)
        if keyword in ("identityfile", "identityfile2"):
            return self.identity(words, where, active[0], user)
        return self.kept(keyword, words, rest, where, active[0])

    def identity(self, words: List[str], where: str, active: bool, user: bool) -> int:
        """IdentityFile accumulates; the same file twice (from the same kind of file) counts once."""
        value = _first(words)
        if active and (value, user) not in [(v, u) for v, _, u in self.opts.identity_files]:
            self.opts.identity_files.append((value, where, user))
            self.opts.sources.setdefault("identityfile", where)
        return 1

    def host_line(self, words: List[str], active: List[bool], never: bool) -> int:
        active[0] = False
        for word in words:
            if word == "":
                raise SyntaxProblem("empty argument")
            if never:
                break
            negated = word.startswith("!")
            if match_pattern(self.host, word[1:] if negated else word):
                if negated:
                    active[0] = False
                    break
                active[0] = True
        return len(words)

    def match_line(self, rest: str, where: str, active: List[bool], never: bool, count: int) -> int:
        result, left = Match(self, where).evaluate(rest)
        active[0] = False if never else result
        return count if left is None or left == "" else 0

    def include(self, words: List[str], where: str, active: List[bool], user: bool, never: bool, depth: int) -> int:
        for word in words:
            if word == "":
                raise SyntaxProblem("empty argument")
            if word.startswith("~") and not user:
                raise SyntaxProblem(f"bad include path {word} (~ only in a user's config)")
            path = word if word.startswith(("/", "~")) else \
                ("~/.ssh/" if user else "/etc/ssh/") + word
            path = self.ctx.home + path[1:] if path.startswith("~/") else path
            outer = active[0]
            for found in sorted(glob.glob(path)):
                if os.path.realpath(found) in self.reading:
                    raise UsageError(f"ssh config {where}: Include {word}: {found} includes itself (through "
                                     f"{' > '.join(self.reading)}): too many recursive configuration includes, "
                                     "as ssh says; remove the loop")
                self.file(found, active, user, not outer or never, depth + 1)
                active[0] = outer  # a Match in an include does not change the including file's state
        return len(words)

    def kept(self, keyword: str, words: List[str], rest: str, where: str, active: bool) -> int:
        """The keywords whose values clusterrun keeps."""
        opts = self.opts
        if keyword in ("proxycommand", "proxyjump"):
            return self.proxy(keyword, words, rest.lstrip(WHITESPACE + "="), where, active)
        if keyword == "port":
            port = a2port(_first(words))
            if port <= 0:
                raise SyntaxProblem(f"bad port {words[0]!r} (a number 1-65535 or a service name)")
            if active:
                _set(opts, "port", port, where, "port")
            return 1
        if keyword == "userknownhostsfile":
            used = check_value("globalknownhostsfile", words, rest)
            if active and opts.known_hosts is None:
                opts.known_hosts = list(words)
                opts.sources.setdefault("userknownhostsfile", where)
            return used
        return self.kept_other(keyword, words, rest, where, active)

    def kept_other(self, keyword: str, words: List[str], rest: str, where: str, active: bool) -> int:
        if keyword in STRINGS:
            value = _first(words)
            if active:
                _set(self.opts, STRINGS[keyword], value, where, keyword)
            return 1
        if keyword in STATES:
            attr, table = STATES[keyword]
            word = _first(words).lower()
            if word not in MULTISTATE[table]:
                raise SyntaxProblem(f'unsupported option "{words[0]}"')
            if active:
                value = word if table == "addressfamily" else CANON_VALUES[word]
                _set(self.opts, attr, (value == 1) if attr == "identities_only" else value, where, keyword)
            return 1
        if keyword == "canonicalizemaxdots":
            value = strtonum(words[0] if words else "", 0, 2 ** 31 - 1)
            if value is None:
                raise SyntaxProblem("integer value invalid")
            if active:
                _set(self.opts, "max_dots", value, where, keyword)
            return 1
        return self.canonical_lists(keyword, words, rest, where, active)

    def canonical_lists(self, keyword: str, words: List[str], rest: str, where: str, active: bool) -> int:
        """CanonicalDomains and CanonicalizePermittedCNAMEs: lists, set once."""
        opts = self.opts
        used = CHECKS[keyword](words, rest)
        if active and keyword == "canonicaldomains" and opts.canonical_domains is None:
            opts.canonical_domains = [w.lower().rstrip(".") for w in words]
            opts.sources.setdefault(keyword, where)
        if active and keyword == "canonicalizepermittedcnames" and opts.permitted_cnames is None:
            opts.permitted_cnames = [("none", "") if w.lower() == "none" else ("*", "*") if w == "*" else
                                     tuple(w.lower().split(":", 1)) for w in words]
            opts.sources.setdefault(keyword, where)
        return used

    def proxy(self, keyword: str, words: List[str], raw: str, where: str, active: bool) -> int:
        """ProxyCommand (the line as written) and ProxyJump exclude each other: the first one given wins,
        and `ProxyJump none` given first means neither (ssh's jump_host "none" skips a later ProxyCommand)."""
        opts = self.opts
        if keyword == "proxycommand":
            if active and opts.proxy_command is None and opts.jump is None:
                opts.proxy_command = raw
                opts.sources.setdefault("proxycommand", where)
            return len(words)
        try:
            jump = parse_jump(raw)
        except SyntaxProblem as exc:
            raise SyntaxProblem(f'Invalid ProxyJump "{raw}": {exc}') from None
        if active and opts.proxy_command is None and opts.jump is None:
            opts.jump = jump
            opts.sources.setdefault("proxyjump", where)
            if not jump.none:
                opts.proxy_command = "none"
        return len(words)


def _check_owner(path: str) -> None:
    try:
        st = os.stat(path)
    except OSError:
        return
    if (st.st_uid not in (0, os.getuid())) or st.st_mode & 0o022:
        raise UsageError(f"ssh config {path}: bad owner or permissions (it must be yours or root's and writable by "
                         f"no one else: chmod go-w {path}), as ssh refuses it")


def _first(words: List[str]) -> str:
    if not words or words[0] == "":
        raise SyntaxProblem("missing argument")
    return words[0]


class Match:
    """One `Match` line (readconf.c match_cfg_line): criteria ANDed, each with its argument."""

    def __init__(self, reader: Reader, where: str):
        self.r, self.where = reader, where
        opts, ctx = reader.opts, reader.ctx
        self.port = opts.port if opts.port > 0 else default_port()
        self.ruser = opts.user or ctx.local_user
        if reader.final:
            self.host = opts.hostname or reader.host
        elif opts.hostname is not None:
            self.host = expand_hostname(opts.hostname, reader.host, opts.sources.get("hostname", where))
        else:
            self.host = reader.host

    def evaluate(self, line: str) -> Tuple[bool, Optional[str]]:
        """(whether the block applies, what is left of the line: ssh refuses a line with words left)."""
        result, attributes, cp = True, 0, line
        while True:
            attrib, cp = strdelim(cp)
            if not attrib:
                break
            if attrib.startswith("#"):
                return result, None
            negate = attrib.startswith("!")
            name = (attrib[1:] if negate else attrib).lower()
            if name == "all":
                return self.all(attrib, negate, attributes, result, cp)
            attributes += 1
            if name in ("canonical", "final"):
                self.r.want_final = self.r.want_final or name == "final"
                result = result and self.r.final != negate
                continue
            arg, cp = strdelim(cp)
            if not arg or arg.startswith("#"):
                raise SyntaxProblem(f"Missing Match criteria for {attrib}")
            if self.criterion(name, attrib, arg, result) == negate:  # every criterion is read, even after a miss
                result = False
        if attributes == 0:
            raise SyntaxProblem("One or more attributes required for Match")
        return result, cp

    @staticmethod
    def all(attrib: str, negate: bool, attributes: int, result: bool, cp: Optional[str]):
        """`all` stands alone (after one other criterion at most, as ssh lets it)."""
        arg, cp = strdelim(cp)
        if attributes > 1 or (arg and not arg.startswith("#")):
            raise SyntaxProblem(f"'{attrib}' cannot be combined with other Match attributes")
        return (result and not negate), (None if arg and arg.startswith("#") else cp)

    def criterion(self, name: str, attrib: str, arg: str, so_far: bool) -> bool:
        ctx = self.r.ctx
        if name == "host":
            return match_hostname(self.host, arg)
        if name == "originalhost":
            return match_hostname(ctx.alias, arg)
        if name == "user":
            return match_pattern_list(self.ruser, arg) == 1
        if name == "localuser":
            return match_pattern_list(ctx.local_user, arg) == 1
        if name == "exec":
            return self.exec(arg, so_far)
        raise SyntaxProblem(f"Unsupported Match attribute {attrib} (OpenSSH 9.2 knows all, canonical, final, exec, "
                            "host, originalhost, user, localuser)")

    def exec(self, arg: str, so_far: bool) -> bool:
        ctx, opts = self.r.ctx, self.r.opts
        tokens = client_tokens(ctx, self.host, str(self.port), self.ruser, opts.host_key_alias or self.host)
        command = percent_expand(arg, tokens)
        if not so_far:
            return False  # ssh skips the command once an earlier criterion failed
        if ctx.run_exec is None:
            self.r.needs = self.r.needs or f"Match exec at {self.where}"
            return False
        status = ctx.run_exec(command)
        if status < 0:
            raise SyntaxProblem(f"match exec '{command}' error (it did not exit normally)")
        return status == 0


def expand_hostname(hostname: str, host: str, where: str) -> str:
    try:
        return percent_expand(hostname, {"h": host})
    except SyntaxProblem as exc:
        raise Refused(where, "hostname", f"{exc}: HostName takes %h and %% only") from None


def client_tokens(ctx: Context, host: str, port: str, user: str, keyalias: str) -> Dict[str, str]:
    """ssh.c's DEFAULT_CLIENT_PERCENT_EXPAND_ARGS: %l is this machine's full name, %L its first label."""
    digest = hashlib.sha1((ctx.thishost + host + port + user).encode()).hexdigest()
    return {"C": digest, "L": ctx.thishost.split(".")[0], "i": str(ctx.uid), "k": keyalias, "l": ctx.thishost,
            "n": ctx.alias, "p": port, "d": ctx.home, "h": host, "r": user, "u": ctx.local_user}
