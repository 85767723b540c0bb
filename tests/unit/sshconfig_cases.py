"""SSH configs for the differential test (sshconfig_oracle.py): written by hand, one or more per kind of
difference issue 38 found, and a seeded generator of mixed ones. `{d}` in a config is the case's folder."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# names the private /etc/hosts resolves (canonicalization); nothing else resolves there
HOSTS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("10.9.0.1", ("node1.lab.example",)),
    ("10.9.0.2", ("node2.lab.example", "alias2.lab.example")),
    ("10.9.0.3", ("gw.lab.example",)),
    ("10.9.1.1", ("node1.dev.example",)),
    ("10.9.1.5", ("db.dev.example",)),
)


@dataclass(frozen=True)
class L:
    """One lookup: the inventory's host, and its user and port where the inventory gives them (-l, -p)."""

    alias: str
    user: Optional[str] = None
    port: Optional[int] = None

    def __str__(self) -> str:
        return self.alias + (f" -l {self.user}" if self.user else "") + (f" -p {self.port}" if self.port else "")


@dataclass
class Case:
    kind: str
    name: str
    config: str
    lookups: Tuple[L, ...]
    files: Dict[str, str] = field(default_factory=dict)  # more files beside config (Include)
    env: Dict[str, str] = field(default_factory=dict)  # for ${VAR}
    unset: Tuple[str, ...] = ()
    deliberate: str = ""  # clusterrun refuses this on purpose, and why (docs/ssh-config.md)

    @property
    def needs_dns(self) -> bool:
        text = (self.config + "".join(self.files.values())).lower()
        return "canonicalizehostname" in text or "canonicalizepermittedcnames" in text

    def write(self, folder: str) -> str:
        os.makedirs(folder, exist_ok=True)
        for rel, text in list(self.files.items()) + [("config", self.config)]:
            path = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", newline="") as fh:
                fh.write(text.replace("{d}", folder))
        return os.path.join(folder, "config")


def _c(kind: str, name: str, config: str, *lookups, **kw) -> Case:
    return Case(kind, name, config, tuple(lk if isinstance(lk, L) else L(lk) for lk in lookups), **kw)


def _canonical() -> List[Case]:
    k = "1 canonicalize"
    base = "CanonicalizeHostname yes\nCanonicalDomains lab.example\n"
    return [
        _c(k, "Host blocks of the canonical name", base + "Host node1.lab.example\n  User labuser\n  Port 2201\n"
           "Host *.lab.example\n  IdentityFile ~/.ssh/lab\n", "node1", "node2", "node3", "node1.lab.example",
           L("node1", "inv")),
        _c(k, "the first domain that resolves", "CanonicalizeHostname yes\nCanonicalDomains nope.example "
           "dev.example lab.example\nHost *.dev.example\n  User dev\n", "node1", "node2", "db", "nothing"),
        _c(k, "no fallback", base + "CanonicalizeFallbackLocal no\n", "node1", "nowhere"),
        _c(k, "max dots 0", base + "CanonicalizeMaxDots 0\nCanonicalDomains example\n", "node1", "node1.lab"),
        _c(k, "max dots 1", "CanonicalizeHostname yes\nCanonicalDomains example\n", "node1.lab", "a.b.c"),
        _c(k, "a jump: not direct", base + "Host node1\n  ProxyJump gw\n", "node1", "gw"),
        _c(k, "always, through a jump", "CanonicalizeHostname always\nCanonicalDomains lab.example\n"
           "Host node1\n  ProxyJump gw\nHost node1.lab.example\n  User canon\n", "node1", "gw"),
        _c(k, "Match canonical", base + "Match canonical host *.lab.example\n  User canon\n"
           "  IdentityFile ~/.ssh/canon\nMatch canonical\n  Port 2299\n", "node1", "node3"),
        _c(k, "a HostName canonicalized", base + "Host web\n  HostName node2\nHost node2.lab.example\n"
           "  User n2\n", "web", "node2"),
        _c(k, "upper case alias", base + "Host NODE1\n  Port 2001\nHost node1.lab.example\n  User low\n", "NODE1",
           "Node2"),
        _c(k, "anchored name", base + "Host node1.lab.example\n  User anchored\n", "node1.lab.example.", "gw."),
        _c(k, "CNAME followed", base + "CanonicalizePermittedCNAMEs *.lab.example:*.lab.example\n"
           "Host node2.lab.example\n  User viacname\n", "alias2", "node1"),
        _c(k, "only inside a Host block", "Host node*\n  CanonicalizeHostname yes\n  CanonicalDomains lab.example\n"
           "Host node1.lab.example\n  User inblock\n", "node1", "gw"),
        _c(k, "addresses canonicalized", "CanonicalizeHostname yes\nCanonicalDomains lab.example\n",
           "10.9.0.1", "10.1", "::ffff:10.9.0.1"),
    ]


def _match() -> List[Case]:
    k = "2 Match exec/final/canonical"
    return [
        _c(k, "exec true: User and IdentityFile", "Match exec true\n  User execuser\n  IdentityFile ~/.ssh/exec_key\n"
           "Host *\n  IdentityFile ~/.ssh/common\n", "a", L("a", "inv")),
        _c(k, "exec false", "Match exec false\n  User no\n  IdentityFile ~/.ssh/no\n", "a"),
        _c(k, "exec with tokens", 'Match host web exec "test %n = web"\n  IdentityFile ~/.ssh/web_%r\n'
           'Match exec "test %h = node9.example -a %p = 2222"\n  User nine\n'
           "Host web\n  HostName node9.example\n  Port 2222\n", "web", "db"),
        _c(k, "final", "Match final\n  IdentityFile ~/.ssh/final\nHost *\n  User common\n"
           "  IdentityFile ~/.ssh/common\n", "a"),
        _c(k, "final host after HostName", "Host web\n  HostName 10.0.0.5\nMatch final host 10.0.0.5\n"
           "  User finaluser\n  IdentityFile ~/.ssh/final5\n", "web", "db"),
        _c(k, "!final", "Match !final\n  User firstpass\nMatch final\n  User secondpass\n  Port 2100\n", "a"),
        _c(k, "Host blocks of the HostName in the final pass", "Host web\n  HostName 10.0.0.7\nHost 10.0.0.7\n"
           "  User byaddr\nMatch final\n", "web", "10.0.0.7"),
        _c(k, "exec skipped after a failed criterion", 'Match host nomatch exec "false"\n  User x\n'
           'Match host a exec "true"\n  User y\n', "a", "b"),
        _c(k, "exec with %C %u %d %L", 'Match exec "test -n %C -a -n %u -a -n %d -a -n %L -a -n %l -a -n %i"\n'
           "  User tokens\n", "a"),
        _c(k, "user and localuser", "Match user admin\n  Port 2022\nMatch localuser root\n  IdentityFile ~/.ssh/rootkey\n"
           "Match localuser nobody\n  User neverme\n", "a", L("a", "admin"), L("a", "Admin")),
        _c(k, "originalhost, case-insensitive", "Match originalhost WEB\n  User weborig\nHost web\n  HostName w1\n"
           "Match host W1\n  Port 2111\n", "web", "WEB"),
        _c(k, "host lists", "Match host a,b\n  User ab\nMatch host !c,*\n  Port 2333\n", "a", "b", "c"),
        _c(k, "all", "Match all\n  User everyone\n", "a"),
        _c(k, "canonical without canonicalization", "Match canonical\n  User canon\nHost b\n  Port 2444\n", "a", "b"),
        _c(k, "canonical with a final pass", "Match canonical\n  User canon\nMatch final\n", "a"),
        _c(k, "exec in an include", "Include {d}/inc\n", "a", "b", files={"inc": "Match originalhost a exec true\n"
           "  IdentityFile ~/.ssh/inc_%n\n  User incuser\n"}),
    ]


def _first_jump() -> List[Case]:
    k = "3 first jump's own proxy"
    return [
        _c(k, "its own ProxyJump", "Host target\n  HostName 10.0.0.10\n  ProxyJump bastion\nHost bastion\n"
           "  HostName 10.0.0.2\n  ProxyJump outer\nHost outer\n  HostName 10.0.0.1\n  User o\n", "target", "bastion"),
        _c(k, "its own ProxyCommand", "Host target\n  ProxyJump bastion\nHost bastion\n"
           "  ProxyCommand nc -X connect -x proxy:3128 %h %p\n  User b\n", "target"),
        _c(k, "later hops' own are ignored", "Host t\n  ProxyJump a,b\nHost a\n  ProxyJump c\nHost b\n  ProxyJump d\n"
           "  ProxyCommand nc %h %p\nHost c\n  User cu\n", "t", "b"),
        _c(k, "a loop", "Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n", "a", "b"),
        _c(k, "a jump to itself", "Host a\n  HostName a\n  ProxyJump a\n", "a"),
        _c(k, "the spec's user and port win", "Host target\n  ProxyJump u@bastion:2222\nHost bastion\n  User x\n"
           "  Port 22\n  HostName 10.0.0.2\n", "target"),
        _c(k, "the hop's own keys", "Host target\n  ProxyJump bastion\n  IdentityFile ~/.ssh/target\nHost bastion\n"
           "  IdentityFile ~/.ssh/bastion_%r\n  User bu\n", "target", L("target", "inv", 2022)),
        _c(k, "three levels", "Host t\n  ProxyJump b2\nHost b2\n  ProxyJump b1\nHost b1\n  ProxyJump b0\n"
           "Host b0\n  HostName 10.0.0.100\n  User zero\n", "t", "b1"),
        _c(k, "first hop's jumps before the rest", "Host t\n  ProxyJump x:2200,y\nHost x\n  ProxyJump w\n"
           "Host w\n  HostName 10.0.0.99\n", "t"),
    ]


def _jump_tokens() -> List[Case]:
    k = "4 ProxyJump tokens"
    return [
        _c(k, "%h", "Host node*\n  ProxyJump gw-%h\nHost gw-*\n  HostName 10.0.0.1\n", "node1", "node2"),
        _c(k, "%r@gw", "Host node*\n  User nu\n  ProxyJump %r@gw\n", "node1", L("node1", "inv")),
        _c(k, "%p as the port", "Host node*\n  Port 2222\n  ProxyJump gw:%p\n", "node1"),
        _c(k, "%n with a HostName", "Host web\n  HostName 10.0.0.5\n  ProxyJump gw-%n\n", "web"),
        _c(k, "%d is not a ProxyCommand token", "Host web\n  ProxyJump gw-%d\n", "web"),
        _c(k, "%h after HostName", "Host web\n  HostName NODE1.example\n  ProxyJump j-%h,k-%n\n", "web"),
        _c(k, "%k", "Host web\n  HostKeyAlias webkey\n  ProxyJump gw-%k\n", "web", "db"),
    ]


def _identity_tokens() -> List[Case]:
    k = "5 IdentityFile tokens"
    return [
        _c(k, "every token", "Host *\n  HostName Node9.Example\n  User ru\n  Port 2022\n"
           "  IdentityFile ~/.ssh/%C\n  IdentityFile ~/.ssh/%k\n  IdentityFile ~/.ssh/%l_%L\n"
           "  IdentityFile ~/.ssh/%n_%h\n  IdentityFile ~/.ssh/%r@%h:%p\n  IdentityFile %d/x_%u_%i\n"
           "  IdentityFile ${HOME}/.ssh/env_key\n  IdentityFile ~/.ssh/%%literal\n", "web", L("Web", "inv", 2200)),
        _c(k, "HostKeyAlias in %k", "Host a\n  HostKeyAlias myalias\n  IdentityFile ~/.ssh/%k\n", "a"),
        _c(k, "an unset variable", "Host a\n  IdentityFile ${UNDEFINED_CR_VAR}/k\n", "a", unset=("UNDEFINED_CR_VAR",)),
        _c(k, "a set variable", "Host a\n  IdentityFile ${CR_KEY_DIR}/id_%h\n", "a", env={"CR_KEY_DIR": "/keys"}),
        _c(k, "an unknown token", "Host a\n  IdentityFile ~/.ssh/%Z\n", "a"),
        _c(k, "none: no keys at all", "Host a\n  IdentityFile none\n", "a", "b"),
        _c(k, "none then a file", "Host a\n  IdentityFile none\n  IdentityFile ~/.ssh/real\n", "a"),
        _c(k, "the same file twice", "Host a\n  IdentityFile ~/.ssh/k\nHost *\n  IdentityFile ~/.ssh/k\n"
           "  IdentityFile ~/.ssh/k2\n", "a", "b"),
        _c(k, "a relative path", "Host a\n  IdentityFile id_relative\n", "a"),
        _c(k, "~user", "Host a\n  IdentityFile ~root/.ssh/rk\n", "a"),
    ]


def _rejects() -> List[Case]:
    k = "6 configs ssh rejects"
    return [
        _c(k, "unknown keyword", "Host a\n  Foo bar\n", "a"),
        _c(k, "unknown keyword in a block that does not apply", "Host zzz\n  Foo bar\nHost a\n  User u\n", "a"),
        _c(k, "IgnoreUnknown", "IgnoreUnknown Foo,Use*\nHost a\n  Foo bar\n  UseKeychain yes\n  User u\n", "a"),
        _c(k, "IgnoreUnknown too late", "Host a\n  Foo bar\nIgnoreUnknown Foo\n", "a"),
        _c(k, "bad port", "Host a\n  Port abc\n", "a"),
        _c(k, "port 0", "Host a\n  Port 0\n", "a"),
        _c(k, "port too large", "Host a\n  Port 70000\n", "a"),
        _c(k, "two users", "Host a\n  User a b\n", "a"),
        _c(k, "Host without a pattern", "Host\n  User u\n", "a"),
        _c(k, "Match with an unknown criterion", "Match foo bar\n  User u\n", "a"),
        _c(k, "Match all with another", "Match all host x\n  User u\n", "a"),
        _c(k, "an unbalanced quote", 'Host a\n  User "bob\n', "a"),
        _c(k, "HostName with a token it does not take", "Host a\n  HostName %p.example\n", "a"),
        _c(k, "ProxyJump without a host", "Host a\n  ProxyJump user@\n", "a"),
        _c(k, "an unsupported option is fine", "Host a\n  RSAAuthentication yes\n  User u\n", "a"),
        _c(k, "a deprecated option is fine", "Host a\n  Cipher blowfish\n  User u\n", "a"),
        _c(k, "a bad flag", "Host a\n  IdentitiesOnly perhaps\n", "a"),
        _c(k, "Match localnetwork (newer OpenSSH)", "Match localnetwork 10.0.0.0/8\n  User u\n", "a"),
        _c(k, "Tag (newer OpenSSH)", "Host a\n  Tag x\n", "a"),
        _c(k, "a bad domain", "CanonicalDomains bad..domain\n", "a"),
        _c(k, "Match exec without a command", "Match exec\n  User u\n", "a"),
        _c(k, "a keyword without a value", "Host a\n  User\n", "a"),
        _c(k, "a bad time", "Host a\n  ConnectTimeout soon\n", "a"),
        _c(k, "a bad cipher", "Host a\n  Ciphers aes128-ctr,nonsense\n", "a"),
        _c(k, "a missing include is fine", "Include {d}/nothing/*.conf\nHost a\n  User u\n", "a"),
        _c(k, "bad IPQoS", "Host a\n  IPQoS fast\n", "a"),
    ]


def _own_reader() -> List[Case]:
    return [
        _c("7 HostName %h", "once", "Host a b\n  HostName %h.example.com\nHost c\n  HostName %h.%h\n", "a", "c"),
        _c("7 Host case", "case-sensitive patterns", "Host Node1\n  User upper\nHost *.LAB\n  User lab\n"
           "Host node1\n  User lower\n", "node1", "Node1", "x.lab", "x.LAB"),
        _c("7 Host comma", "one literal pattern", "Host web,db\n  User commas\nHost *\n  User rest\n", "web", "db",
           "web,db"),
        _c("7 Host comma", "Match takes lists", "Match host web,db\n  User listed\n", "web", "db", "x"),
        _c("7 ProxyCommand quoting", "double quotes", 'Host a\n  ProxyCommand sh -c "nc %h %p"\n', "a"),
        _c("7 ProxyCommand quoting", "single quotes and brackets", "Host a\n  ProxyCommand ssh -W '[%h]:%p' gw\n", "a"),
        _c("7 ProxyCommand quoting", "a comment, = and tokens", "Host a\n  ProxyCommand=nc %h %p # via nc\n"
           "Host b\n  ProxyCommand nc -x %r@%k:%%%n %h %p\n", "a", "b"),
        _c("7 ProxyCommand quoting", "an unknown token", "Host a\n  ProxyCommand nc %d %h\n", "a"),
        _c("7 ProxyJump URL", "ssh:// forms", "Host a\n  ProxyJump ssh://ju@gw:2222\nHost b\n  ProxyJump ssh://gw\n"
           "Host c\n  ProxyJump ssh://[10.0.0.1]:2200,ssh://u2@gw2\nHost d\n  ProxyJump ssh://u;fp=x@gw\n", "a", "b",
           "c", "d"),
        _c("7 ProxyJump URL", "a path is not allowed", "Host a\n  ProxyJump ssh://gw/path\n", "a"),
        _c("7 ProxyJump none", "then a ProxyCommand", "Host a\n  ProxyJump none\n  ProxyCommand nc %h %p\n"
           "Host b\n  ProxyCommand none\n  ProxyJump gw\nHost c\n  ProxyJump gw\n  ProxyCommand nc %h %p\n"
           "Host d\n  ProxyCommand nc %h %p\n  ProxyJump gw\n", "a", "b", "c", "d"),
        _c("7 ProxyJump none", "in a later block", "Host a\n  ProxyJump none\nHost *\n  ProxyJump gw\n", "a", "b"),
        _c("7 # in a word", "not a comment", "Host a\n  IdentityFile ~/.ssh/id#1\n  User a#b\n  HostName h#1\n", "a"),
        _c("7 # in a word", "comments after values", "Host a # the a host\n  User bob # the user\n"
           "  # a comment line\n  Port 2222#no\n", "a"),
        _c("7 # in a word", "a comment in a ProxyJump", "Host a\n  ProxyJump gw # via gw\nHost b\n"
           "  ProxyJump g1,g2 # via g1,g2\n", "a", "b"),
        _c("7 Port ssh", "service names", "Host a\n  Port ssh\nHost b\n  Port http\nHost c\n  Port nosuchservice\n",
           "a", "b", "c"),
        _c("7 Port ssh", "in a ProxyJump", "Host a\n  ProxyJump gw:ssh\n", "a"),
        _c("basics", "= syntax", "Host a\n  User=bob\n  Port = 2222\n  HostName= h.example\nHost b\n"
           "  User  =  spaced\n", "a", "b"),
        _c("basics", "quoted values", 'Host a\n  IdentityFile "~/.ssh/my key"\n  User "b o b"\n', "a"),
        _c("basics", "tabs and CRLF", "Host a\r\n\tUser\tbob\r\n\tPort 2200  \r\n", "a"),
        _c("basics", "keywords in any case", "HOST a\n  HOSTNAME A.Example\n  user U\n", "a"),
        _c("basics", "Include: globs in order", "Include {d}/conf.d/*.conf\nHost *\n  User fallback\n", "a", "b",
           "c", files={"conf.d/20-b.conf": "Host a b\n  User twenty\n", "conf.d/10-a.conf": "Host a\n  User ten\n"
                       "  Port 2010\n", "conf.d/skip.txt": "Host c\n  User skipped\n"}),
        _c("basics", "Include inside a Host block", "Host special\n  Include {d}/inc\nHost *\n  Port 2999\n",
           "special", "plain", files={"inc": "User included\nHost *\n  IdentityFile ~/.ssh/inc\n"}),
        _c("basics", "a Match in an include does not leak", "Host a\n  Include {d}/inc\n  User outer\n", "a", "b",
           files={"inc": "Match host nomatch\n  Port 1\n"}),
        _c("basics", "negation", "Host * !bad\n  User good\nHost !only\n  Port 2001\n", "x", "bad", "only"),
        _c("basics", "first value wins", "Host *\n  User star\nHost a\n  User a\n  Port 2200\nHost *\n  Port 2300\n",
           "a", L("a", "inv", 2400)),
        _c("basics", "Match user with the inventory's user", "Match user deploy\n  IdentityFile ~/.ssh/deploy\n"
           "Host a\n  User configured\n", "a", L("a", "deploy")),
        _c("basics", "HostName forms", "Host up\n  HostName Node.EXAMPLE\nHost v6\n  HostName ::1\nHost short\n"
           "  HostName 10.1\nHost octal\n  HostName 010.0.0.1\n", "up", "v6", "short", "octal"),
        _c("basics", "an alias nothing says anything about", "Host a\n  User u\n", "unknown", "10.0.0.9"),
        _c("basics", "IdentityFile order", "Host a\n  IdentityFile ~/.ssh/1\nHost *\n  IdentityFile ~/.ssh/2\n"
           "Match all\n  IdentityFile ~/.ssh/3\n", "a", "b"),
        _c("basics", "several hops with ports", "Host a\n  ProxyJump j1:2201,ju@j2:2202\nHost j2\n  User j2user\n",
           "a"),
        _c("basics", "ProxyCommand tokens of a HostName", "Host a\n  HostName 10.0.0.3\n  User pu\n  Port 2022\n"
           "  ProxyCommand nc %h %p %r %n\n", "a", L("a", "inv", 2200)),
        _c("basics", "User with a token (taken literally by 9.2)", "Host a\n  User %u\n", "a"),
    ]


def _syntax() -> List[Case]:
    k = "syntax"
    return [
        _c(k, "quotes in words", 'Host a\n  User a\'b\'c\n  HostName "h.example"\n  IdentityFile ~/.ssh/a\\ b\n'
           '  IdentityFile "~/.ssh/x\\"y"\n  IdentityFile "~/.ssh/k "\n', "a"),
        _c(k, "an unbalanced single quote", "Host a\n  IdentityFile ~/.ssh/it's\n", "a"),
        _c(k, "a quoted keyword", '"User" bob\n', "a"),
        _c(k, "= forms", 'Host a\n  Port="2222"\n  User =bob\nHost b\n  Port==22\n', "a", "b"),
        _c(k, "ProxyCommand and ProxyJump after =", "Host a\n  ProxyCommand==nc %h %p\nHost b\n  ProxyJump = gw\n"
           "Host c\n  ProxyJump==gw2\n", "a", "b", "c"),
        _c(k, "# in Host patterns", "Host a#b\n  User hashed\nHost a #b\n  User plain\n", "a", "a#b", "b"),
        _c(k, "Match words", 'Match host=a\n  User eq\nMatch Host b # comment\n  User bee\n'
           'Match exec "test 1 = 1" host c\n  User cee\nMatch exec true originalhost d\n  User dee\n', "a", "b",
           "c", "d"),
        _c(k, "indentation and form feeds", "\t  Host a  \f\n\t\tUser   tabbed\t\n   \n# only a comment\n", "a"),
        _c(k, "an empty config", "", "a", "10.0.0.1"),
        _c(k, "HostName %%", "Host a\n  HostName x%%y\n  IdentityFile ~/.ssh/%h\n", "a"),
        _c(k, "several patterns, spaces and tabs", "Host  x \t a\ty\n  User many\n", "a", "y", "z"),
        _c(k, "a relative Include (in ~/.ssh)", "Include cr_no_such_file_38.conf\nHost a\n  User u\n", "a"),
        _c(k, "an Include of several globs", "Include {d}/x/*.conf {d}/y/*.conf\n", "a",
           files={"x/1.conf": "Host a\n  Port 2001\n", "y/1.conf": "Host a\n  Port 2002\n  User y\n"}),
        _c(k, "non-ASCII", "Host a\n  User j\u00f6rg\n", "a"),
        _c(k, "Match all and a comment", "Match all # everything\n  User all\n", "a"),
        _c(k, "Match host then all", "Match host a all\n  User hostall\n", "a", "b"),
        _c(k, "Match !all", "Match !all\n  User never\n", "a"),
        _c(k, "Host line with an empty quoted pattern", 'Host ""\n  User empty\n', "a"),
        _c(k, "Host negation before a match", "Host !a *\n  User notA\n", "a", "b"),
    ]


def hand_written() -> List[Case]:
    return (_canonical() + _match() + _first_jump() + _jump_tokens() + _identity_tokens() + _rejects() +
            _own_reader() + _syntax())


# ------------------------------------------------------------------ generated

ALIASES = ("web", "db", "node1", "node2", "Node1", "gw", "bastion", "a.lab", "b.lab", "10.0.0.5")
PATTERNS = ("web", "db", "node1", "node*", "*", "*.lab", "!db", "web,db", "NODE*", "?b", "gw", "bastion",
            "10.0.0.*", "!node2")
CRITERIA = ("host web", "host node*,!node2", "originalhost gw", "user root", "user admin", "localuser root", "all",
            "final", "!final", "exec true", "exec false", 'exec "test %h = web"', "canonical", "host 10.0.0.*",
            "originalhost NODE1", "host web exec true")
OPTIONS = (
    ("HostName", ("%h.example", "10.0.0.5", "NODE.EXAMPLE", "gw.lab", "h%h", '"quoted.example"', "10.1")),
    ("User", ("u1", "u2", "admin", "root", '"spaced user"', "it\\'s")),
    ("Port", ("22", "2222", "ssh", "2200", '"2201"')),
    ("IdentityFile", ("~/.ssh/k_%h", "~/.ssh/k_%r", "~/.ssh/k_%C", "~/.ssh/plain", "none", "~/.ssh/k_%n_%p",
                      "~/.ssh/id#1", "~/.ssh/k_%l_%L_%u", '"~/.ssh/sp ace"', "%d/.ssh/k_%k")),
    ("ProxyJump", ("gw", "bastion", "u@gw:2200", "ssh://gw", "none", "gw,bastion", "j-%h", "%r@gw", "ssh://u@gw:2202")),
    ("ProxyCommand", ("nc %h %p", "sh -c 'nc %h %p'", "none", 'ssh -W "[%h]:%p" gw', "nc %n %r")),
    ("IdentitiesOnly", ("yes", "no")),
    ("HostKeyAlias", ("keyalias",)),
    ("ServerAliveInterval", ("30",)),
)


def _option(rng: random.Random) -> str:
    key, values = rng.choice(OPTIONS)
    value = rng.choice(values)
    sep = rng.choice((" ", " ", " ", "=", " = "))
    comment = rng.choice(("", "", "", "", " # note"))
    if key == "ProxyJump" and comment and "," in value:
        comment = ""
    return f"  {key}{sep}{value}{comment}\n"


def _block(rng: random.Random) -> str:
    if rng.random() < 0.6:
        head = "Host " + " ".join(rng.sample(PATTERNS, rng.choice((1, 1, 2))))
    else:
        head = "Match " + rng.choice(CRITERIA)
    return head + "\n" + "".join(_option(rng) for _ in range(rng.randint(1, 4)))


def generated(count: int, seed: int = 38) -> List[Case]:
    rng = random.Random(seed)
    cases = []
    for number in range(count):
        text = "".join(_block(rng) for _ in range(rng.randint(2, 6)))
        if rng.random() < 0.1:
            text = "CanonicalizeHostname yes\nCanonicalDomains lab.example\n" + text
        lookups = []
        for alias in rng.sample(ALIASES, rng.choice((2, 2, 3))):
            roll = rng.random()
            lookups.append(L(alias, "admin" if roll < 0.15 else None, 2022 if 0.15 <= roll < 0.25 else None))
        cases.append(Case("generated", f"#{number}", text, tuple(lookups)))
    return cases
