"""The words of an SSH config as OpenSSH 9.2 reads them (misc.c, match.c): splitting a line, patterns,
%-tokens and ${VARS}, ports (service names too), times, domains, and the [user@]host[:port] and ssh:// forms
of ProxyJump. Each function says which of OpenSSH's it follows; a difference from it is a bug here.

Pure: no I/O beyond the system's user and service tables (`~user`, `Port ssh`).
"""

from __future__ import annotations

import pwd
import socket
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Tuple

WHITESPACE = " \t\r\n"
INT_MAX = 2 ** 31 - 1


class SyntaxProblem(ValueError):
    """A word OpenSSH refuses; the reader adds the file:line and keyword."""


def strdelim(s: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """misc.c strdelim: the next word and the rest. Words end at whitespace or one `=`; a double quote opens
    a part of the word that runs to the next double quote. The word is None for an unmatched quote; the
    rest is None once the line is used up."""
    if s is None:
        return None, None
    cut = next((i for i, c in enumerate(s) if c in WHITESPACE + '"='), -1)
    if cut < 0:
        return s, None
    if s[cut] == '"':
        s = s[:cut] + s[cut + 1:]
        close = s.find('"', cut)
        if close < 0:
            return None, None
        return s[:close], s[close + 1:].lstrip(WHITESPACE)
    was_equals = s[cut] == "="
    word, rest = s[:cut], s[cut + 1:].lstrip(WHITESPACE)
    if rest.startswith("=") and not was_equals:
        rest = rest[1:].lstrip(WHITESPACE)
    return word, rest


def argv_split(s: str) -> Optional[List[str]]:
    """misc.c argv_split(terminate_on_comment=1): words split at spaces and tabs, '…' and "…" quote, a
    backslash escapes a quote, a backslash or (outside quotes) a space; a `#` starting a word ends the line
    (inside a word it is a letter). None: a quote is not closed."""
    words: List[str] = []
    i, n = 0, len(s)
    while i < n:
        if s[i] in " \t":
            i += 1
            continue
        if s[i] == "#":
            break
        word, i, open_quote = _argv_word(s, i)
        if open_quote:
            return None
        words.append(word)
        i += 1
    return words


def _argv_word(s: str, i: int) -> Tuple[str, int, bool]:
    """One word of argv_split from s[i]: (the word, where it ended, whether a quote is left open)."""
    word, quote, n = [], "", len(s)
    while i < n:
        c = s[i]
        nxt = s[i + 1] if i + 1 < n else ""
        if c == "\\" and (nxt in ("'", '"', "\\") and nxt or (not quote and nxt == " ")):
            i += 1
            word.append(nxt)
        elif not quote and c in " \t":
            break
        elif not quote and c in "\"'":
            quote = c
        elif quote and c == quote:
            quote = ""
        else:
            word.append(c)
        i += 1
    return "".join(word), i, bool(quote) and i >= n


def match_pattern(s: str, pattern: str) -> bool:
    """match.c match_pattern: `*` and `?`, case-sensitive, the whole string."""
    si = pi = 0
    star, mark = -1, 0
    while si < len(s):
        if pi < len(pattern) and (pattern[pi] == "?" or pattern[pi] == s[si]):
            si, pi = si + 1, pi + 1
        elif pi < len(pattern) and pattern[pi] == "*":
            star, mark, pi = pi, si, pi + 1
        elif star >= 0:
            pi, mark = star + 1, mark + 1
            si = mark
        else:
            return False
    return all(c == "*" for c in pattern[pi:])


def match_pattern_list(s: str, patterns: str, lower: bool = False) -> int:
    """match.c match_pattern_list: 1 when some comma-separated pattern matches and no negated (`!`) one
    does, -1 when a negated one does, 0 otherwise; with lower, the patterns are lower-cased first."""
    positive = 0
    for sub in patterns.split(","):
        negated = sub.startswith("!")
        sub = sub[1:] if negated else sub
        if lower:
            sub = sub.lower()
        if match_pattern(s, sub):
            if negated:
                return -1
            positive = 1
    return positive


def match_hostname(host: str, patterns: str) -> bool:
    """match.c match_hostname: a pattern list, host and patterns lower-cased."""
    return match_pattern_list(host.lower(), patterns, True) == 1


def percent_expand(text: str, tokens: Mapping[str, str], environ: Optional[Mapping[str, str]] = None) -> str:
    """misc.c percent_expand (and, given environ, percent_dollar_expand): `%%` is `%`, `%X` a token's value,
    `${VAR}` the variable's; an unknown token or an unset variable is an error, as it is fatal to ssh."""
    out, i = [], 0
    while i < len(text):
        if environ is not None and text.startswith("${", i):
            end = text.find("}", i + 2)
            if end < 0:
                raise SyntaxProblem(f"environment variable '{text[i + 2:]}' missing closing '}}'")
            name = text[i + 2:end]
            if not name:
                raise SyntaxProblem("zero-length environment variable")
            if name not in environ:
                raise SyntaxProblem(f"env var ${{{name}}} has no value")
            out.append(environ[name])
            i = end + 1
            continue
        if text[i] != "%":
            out.append(text[i])
            i += 1
            continue
        if i + 1 >= len(text):
            raise SyntaxProblem(f"invalid format: {text!r} ends in %")
        key = text[i + 1]
        if key == "%":
            out.append("%")
        elif key in tokens:
            out.append(tokens[key])
        else:
            raise SyntaxProblem(f"unknown token %{key} (this keyword takes {' '.join('%' + k for k in tokens)})")
        i += 2
    return "".join(out)


def tilde_expand(path: str, home: str) -> str:
    """misc.c tilde_expand: `~` and `~/…` are home's, `~user/…` that user's home; a user that does not
    exist is an error."""
    if not path.startswith("~"):
        return path
    rest = path[1:]
    if not rest or rest.startswith("/"):
        base, tail = home, rest.lstrip("/")
    else:
        name, _, tail = rest.partition("/")
        try:
            base = pwd.getpwnam(name).pw_dir
        except KeyError:
            raise SyntaxProblem(f"no such user {name} (in {path})") from None
        tail = tail.lstrip("/")
    return base + ("" if base.endswith("/") else "/") + tail


def a2port(s: str) -> int:
    """misc.c a2port: 0-65535, or a TCP service name (`ssh`, `http`); -1 when it is neither."""
    value = strtonum(s, 0, 65535)
    if value is not None:
        return value
    try:
        return socket.getservbyname(s, "tcp")
    except (OSError, UnicodeError):
        return -1


def default_port() -> int:
    port = a2port("ssh")
    return port if port > 0 else 22


def strtonum(s: str, low: int, high: int) -> Optional[int]:
    """OpenBSD strtonum: a decimal integer (leading blanks and a sign allowed) within [low, high], else None."""
    text = s.lstrip(" \t\n\r\f\v")
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or any(c not in "0123456789" for c in body):
        return None
    value = int(text)
    return value if low <= value <= high else None


def convtime(s: str) -> int:
    """misc.c convtime: `90`, `1m30s`, `2h`, `1d`, `1w` in seconds; -1 when it is not a time."""
    if not s:
        return -1
    total, i = 0, 0
    units = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    while i < len(s):
        j = i
        while j < len(s) and s[j].isdigit():
            j += 1
        if j == i:
            return -1
        unit = s[j:j + 1].lower()
        if unit not in units:
            return -1
        total += int(s[i:j]) * units[unit]
        if total > INT_MAX:
            return -1
        i = j + (1 if unit else 0)
    return total


def valid_domain(name: str) -> Optional[str]:
    """misc.c valid_domain: why name is not a domain (None when it is; a trailing dot is allowed)."""
    if not name:
        return "empty domain name"
    if not (name[0].isascii() and name[0].isalnum()):
        return f'domain name "{name}" starts with invalid character'
    if ".." in name:
        return f'domain name "{name}" contains consecutive separators'
    if any(not (c.isascii() and (c.isalnum() or c in ".-_")) for c in name):
        return f'domain name "{name}" contains invalid characters'
    return None


@dataclass(frozen=True)
class Jump:
    """A ProxyJump as ssh holds it: the last hop (user, host, port; None/-1 where not given) and the hops
    before it as written (`extra`, what ssh passes on as `-J`)."""

    user: Optional[str]
    host: str
    port: int = -1
    extra: Optional[str] = None

    @property
    def none(self) -> bool:
        return self.host == "none" and self.port == 0 and self.user is None

    def printed(self) -> str:
        """As `ssh -G` prints it."""
        bracket = ":" in self.host or all(c in "0123456789." for c in self.host)
        host = f"[{self.host}]" if bracket else self.host
        return (f"{self.extra}," if self.extra else "") + (f"{self.user}@" if self.user else "") + host + \
            (f":{self.port}" if self.port > 0 else "")


def _hpdelim(s: str, slash: bool) -> Tuple[str, str, Optional[str]]:
    """misc.c hpdelim2: (host, the delimiter after it, the rest); a [bracketed] host may hold colons."""
    if s.startswith("["):
        close = s.find("]")
        if close < 0:
            raise SyntaxProblem(f"no closing ] in {s!r}")
        cut = close + 1
    else:
        cut = next((i for i, c in enumerate(s) if c in ":/"), len(s))
    if cut == len(s):
        return s, "", None
    if s[cut] not in ":/" or (s[cut] == "/" and not slash):
        raise SyntaxProblem(f"unexpected {s[cut:]!r} after the host")
    return s[:cut], s[cut], s[cut + 1:]


def _clean(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def parse_user_host_port(s: str) -> Tuple[Optional[str], str, int]:
    """misc.c parse_user_host_port: [user@]host[:port] (the last @ ends the user)."""
    user = None
    if "@" in s:
        user, _, s = s.rpartition("@")
        if not user:
            raise SyntaxProblem("empty user name")
    host, _, rest = _hpdelim(s, slash=False)
    if not host:
        raise SyntaxProblem("no host")
    port = -1
    if rest:
        port = a2port(rest)
        if port <= 0:
            raise SyntaxProblem(f"bad port {rest!r}")
    return user, _clean(host), port


def parse_ssh_uri(s: str) -> Optional[Tuple[Optional[str], str, int]]:
    """misc.c parse_uri("ssh", …) as parse_ssh_uri uses it: ssh://[user[;params]@]host[:port][/], the user
    %-encoded, the host a domain or an address in brackets; None when s is not an ssh:// URI; a path is
    refused."""
    if not s.startswith("ssh://"):
        return None
    rest, user = s[6:], None
    if "@" in rest:
        user, _, rest = rest.partition("@")
        user = user.split(";", 1)[0]
        if not user:
            raise SyntaxProblem(f"empty user name in {s!r}")
        user = _urldecode(user)
    host, delim, rest = _hpdelim(rest, slash=True)
    host = _clean(host)
    if not host or valid_domain(host) is not None:
        raise SyntaxProblem(f"bad host in {s!r}")
    port = -1
    if rest and delim == ":":
        port_text, slash, rest = rest.partition("/")
        port = a2port(port_text)
        if port <= 0:
            raise SyntaxProblem(f"bad port in {s!r}")
    if rest:
        raise SyntaxProblem(f"a path is not allowed in a ProxyJump URI ({s!r})")
    return user, host.rstrip(".") if host.endswith(".") else host, port


def _urldecode(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "+":
            out.append(" ")
        elif text[i] == "%":
            code = text[i + 1:i + 3]
            if len(code) != 2 or any(c not in "0123456789abcdefABCDEF" for c in code):
                raise SyntaxProblem(f"bad %-encoding in {text!r}")
            out.append(chr(int(code, 16)))
            i += 2
        else:
            out.append(text[i])
        i += 1
    return "".join(out)


def _one_hop(spec: str) -> Tuple[Optional[str], str, int]:
    uri = parse_ssh_uri(spec)
    return uri if uri is not None else parse_user_host_port(spec)


def parse_jump(s: str) -> Jump:
    """readconf.c parse_jump: `none`, or hops separated by commas, each [user@]host[:port] or an ssh:// URI.
    Every hop's syntax is checked; the last is the one ssh connects through, the rest (as written, as ssh
    keeps them, a trailing comment's text included) are passed on."""
    if s.lower() == "none":
        return Jump(None, "none", 0)
    text = s.split("#", 1)[0].rstrip(WHITESPACE)
    hops = text.split(",")
    user, host, port = _one_hop(hops[-1])
    for hop in hops[:-1]:
        _one_hop(hop)
    comma = s.rfind(",")
    return Jump(user, host, port, s[:comma] if comma > 0 else None)


Resolver = Callable[[str], Optional[Tuple[str, str]]]  # name -> (address, canonical name) or None
