"""The differential harness for ~/.ssh/config: what OpenSSH itself would connect to, and what clusterrun would.

OpenSSH's side comes from `ssh -G` (which prints the effective options and never connects) plus what ssh does
after printing them, rebuilt here independently of clusterrun's code:
- IdentityFile tokens are expanded by ssh itself: the file is handed back as `-o ControlPath=FILE`, which ssh
  expands before `-G` prints it with the same tokens and environment it uses for identity files;
- ProxyJump is followed as ssh follows it: for `ProxyJump A,B` ssh runs `ssh [-l U] [-p P] -J A -W ... B`
  (the whole line %-expanded like a ProxyCommand), so B is looked up again with `-J A` (its own ProxyJump and
  ProxyCommand do not apply), and A without (its own do: the first jump's own jumps come first);
- a ProxyCommand is expanded with the five tokens ssh's expand_proxy_command knows (h k n p r).
test_ssh_config_differential.py checks these rebuilt steps against ssh itself (a $SHELL that records the
command ssh would run), so the oracle does not share a bug with clusterrun.

Every ssh runs in a private mount (and UTS) namespace where /etc/hosts is a file of this harness and
/etc/nsswitch.conf says `hosts: files`: CanonicalizeHostname can be exercised and no name lookup leaves the
machine. Where no such namespace can be made, configs that make ssh resolve names are not given to ssh.

    python tests/unit/sshconfig_oracle.py [--generated 120] [--seed 38] [--show]   the agree/differ counts
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

LOCAL_HOSTNAME = "crtest.lab.example"  # the namespace's hostname: %l and %L differ only when it has a dot
DEFAULT_IDS = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
               "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa")
MAX_DEPTH = 8

_SERVER = r'''
import json, os, socket, subprocess, sys, threading
from concurrent.futures import ThreadPoolExecutor
hosts, nss, name = sys.argv[1:4]
subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
subprocess.run(["mount", "--bind", nss, "/etc/nsswitch.conf"], check=True)
if name:
    socket.sethostname(name)
lock = threading.Lock()
def one(req):
    try:
        done = subprocess.run(req["argv"], env=req["env"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=30)
        out = {"id": req["id"], "rc": done.returncode, "out": done.stdout, "err": done.stderr}
    except Exception as exc:
        out = {"id": req["id"], "rc": -1, "out": "", "err": repr(exc)}
    with lock:
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
print(json.dumps({"ready": socket.gethostname()}), flush=True)
with ThreadPoolExecutor(4) as pool:
    for line in sys.stdin:
        pool.submit(one, json.loads(line))
'''


def hosts_file(entries: Sequence[Tuple[str, Sequence[str]]]) -> str:
    """/etc/hosts lines; every name also with a trailing dot (ssh looks up `NAME.DOMAIN.`, glibc's files
    backend matches names literally)."""
    lines = ["127.0.0.1 localhost", f"127.0.1.1 {LOCAL_HOSTNAME} {LOCAL_HOSTNAME.split('.')[0]}"]
    for addr, names in entries:
        lines.append(" ".join([addr, *names, *(n + "." for n in names)]))
    return "\n".join(lines) + "\n"


class SshRunner:
    """Runs commands (ssh) in the private namespace, in parallel, each distinct command once."""

    def __init__(self, workdir: str, hosts: Sequence[Tuple[str, Sequence[str]]]):
        self.private = False
        self.local_hostname = ""
        self._cache: Dict[tuple, Future] = {}
        self._pending: Dict[int, Future] = {}
        self._lock = threading.Lock()
        self._next = 0
        self.calls = 0
        self._proc: Optional[subprocess.Popen] = None
        self._start(workdir, hosts)

    def _start(self, workdir: str, hosts) -> None:
        if os.geteuid() != 0 or not shutil.which("unshare"):
            return
        hosts_path, nss_path = os.path.join(workdir, "hosts"), os.path.join(workdir, "nsswitch.conf")
        with open(hosts_path, "w") as fh:
            fh.write(hosts_file(hosts))
        with open(nss_path, "w") as fh:
            fh.write(_nsswitch())
        try:
            proc = subprocess.Popen(["unshare", "-m", "-u", sys.executable, "-c", _SERVER, hosts_path, nss_path,
                                     LOCAL_HOSTNAME], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, bufsize=1)
            first = proc.stdout.readline()
        except OSError:
            return
        if not first or json.loads(first).get("ready") != LOCAL_HOSTNAME:
            proc.kill()
            proc.wait()
            return
        self._proc = proc
        threading.Thread(target=self._replies, daemon=True).start()
        probe = (hosts[0][1][0] + ".") if hosts else "localhost"
        rc, _, _ = self.run(["getent", "ahosts", probe], dict(os.environ))  # our hosts file is the one in force
        self.private = rc == 0
        self.local_hostname = LOCAL_HOSTNAME

    def _replies(self) -> None:
        for line in self._proc.stdout:
            reply = json.loads(line)
            with self._lock:
                future = self._pending.pop(reply["id"])
            future.set_result((reply["rc"], reply["out"], reply["err"]))

    def submit(self, argv: Sequence[str], env: Dict[str, str]) -> Future:
        key = (tuple(argv), tuple(sorted(env.items())))
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            future: Future = Future()
            self._cache[key] = future
            self.calls += 1
            if self._proc is not None:
                self._next += 1
                self._pending[self._next] = future
                self._proc.stdin.write(json.dumps({"id": self._next, "argv": list(argv), "env": env}) + "\n")
                self._proc.stdin.flush()
                return future
        done = subprocess.run(list(argv), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=30)
        future.set_result((done.returncode, done.stdout, done.stderr))
        return future

    def run(self, argv: Sequence[str], env: Dict[str, str]) -> Tuple[int, str, str]:
        return self.submit(argv, env).result(timeout=60)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
            self._proc = None


def _nsswitch() -> str:
    try:
        with open("/etc/nsswitch.conf") as fh:
            lines = [ln for ln in fh.read().splitlines() if not ln.strip().startswith("hosts:")]
    except OSError:
        lines = []
    return "\n".join(lines + ["hosts: files"]) + "\n"


# ------------------------------------------------------------------ answers


@dataclass(frozen=True)
class Hop:
    hostname: str
    port: int
    user: str
    identities: Union[str, Tuple[str, ...]]  # "defaults" (none configured) or the files in order
    proxy: Optional[str] = None  # the ProxyCommand as run (tokens expanded, without ssh's "exec ")


@dataclass(frozen=True)
class Answer:
    chain: Tuple[Hop, ...] = ()  # jump hosts first, the target last
    refused: str = ""  # why the lookup fails (ssh exits non-zero, clusterrun raises)
    crashed: str = ""  # clusterrun raised something that is not a ClusterrunError

    @property
    def ok(self) -> bool:
        return not self.refused and not self.crashed

    def show(self) -> str:
        if self.crashed:
            return "CRASH " + self.crashed
        if self.refused:
            return "REFUSED " + self.refused
        return " -> ".join(f"{h.user}@{h.hostname}:{h.port}"
                           + ("" if h.identities == "defaults" else f" ids={list(h.identities)}")
                           + (f" proxy={h.proxy!r}" if h.proxy else "") for h in self.chain)


class SshFails(Exception):
    pass


def parse_g(text: str) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        found.setdefault(key.lower(), []).append(rest)
    return found


def percent(text: str, tokens: Dict[str, str]) -> str:
    """OpenSSH's percent_expand: %% is %, a known token its value, anything else a fatal error."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "%":
            out.append(text[i])
            i += 1
            continue
        if i + 1 >= len(text):
            raise SshFails(f"percent_expand: invalid format in {text!r}")
        key = text[i + 1]
        if key == "%":
            out.append("%")
        elif key in tokens:
            out.append(tokens[key])
        else:
            raise SshFails(f"percent_expand: unknown key %{key} in {text!r}")
        i += 2
    return "".join(out)


def g_argv(cfg: str, alias: str, user: Optional[str], port: Optional[int], jump: Optional[str],
           extra: Sequence[str] = ()) -> List[str]:
    return (["ssh", "-G", "-F", cfg] + (["-l", user] if user else []) + (["-p", str(port)] if port else [])
            + (["-J", jump] if jump else []) + list(extra) + ["--", alias])


class Oracle:
    """What OpenSSH would connect to for one lookup, from ssh -G and ssh's own expansion."""

    def __init__(self, runner: SshRunner, cfg: str, env: Dict[str, str]):
        self.runner, self.cfg, self.env = runner, cfg, env
        self.home = pwd.getpwuid(os.getuid()).pw_dir

    def answer(self, alias: str, user: Optional[str] = None, port: Optional[int] = None) -> Answer:
        try:
            return Answer(tuple(self.chain(alias, user, port, None, ())))
        except SshFails as exc:
            return Answer(refused=str(exc))

    def chain(self, alias, user, port, jump, stack) -> List[Hop]:
        key = (alias, user, port, jump)
        if key in stack or len(stack) > MAX_DEPTH:
            raise SshFails(f"ProxyJump loop through {alias}: ssh would start ssh for ever")
        rc, out, err = self.runner.run(g_argv(self.cfg, alias, user, port, jump), self.env)
        if rc != 0:
            raise SshFails(f"ssh -G {alias} exited {rc}: {_last(err)}")
        g = parse_g(out)
        hostname, port_, user_ = g["hostname"][0], int(g["port"][0]), g["user"][0]
        tokens = {"h": hostname, "k": (g.get("hostkeyalias") or [alias])[0], "n": alias, "p": str(port_),
                  "r": user_}
        ids = self.identities(alias, user, port, jump, g)
        if "proxyjump" in g:
            ju, jp, extra, jh = _nested_argv(self.proxy_command(g, tokens))
            hops = self.chain(jh, ju, jp, extra, stack + (key,))
            return hops + [Hop(hostname, port_, user_, ids)]
        proxy = g.get("proxycommand", [None])[0]
        return [Hop(hostname, port_, user_, ids, percent(proxy, tokens) if proxy else None)]

    def proxy_command(self, g: Dict[str, List[str]], tokens: Dict[str, str]) -> str:
        """The command ssh runs to reach the host (without its "exec "): the ProxyCommand, or for a ProxyJump
        the `ssh [-l U] [-p P] [-J EXTRA] -F CFG -W '[%h]:%p' HOP` of ssh.c main(), tokens expanded."""
        if "proxyjump" not in g:
            return percent(g["proxycommand"][0], tokens)
        extra, _, last = g["proxyjump"][0].rpartition(",")
        ju, jh, jp = _user_host_port(last)
        line = ("ssh" + (f" -l {ju}" if ju else "") + (f" -p {jp}" if jp else "") + (f" -J {extra}" if extra else "")
                + f" -F {self.cfg} -W '[%h]:%p' {jh}")
        return percent(line, tokens)

    def identities(self, alias, user, port, jump, g) -> Union[str, Tuple[str, ...]]:
        raw = tuple(g.get("identityfile", ()))
        if raw == DEFAULT_IDS:
            return "defaults"
        files = []
        for name in raw:
            if name.lower() == "none":
                continue
            if "%" in name or "${" in name or (name.startswith("~") and not name.startswith("~/")):
                quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
                rc, out, err = self.runner.run(g_argv(self.cfg, alias, user, port, jump,
                                                      ["-o", f"ControlPath={quoted}"]), self.env)
                if rc != 0:
                    raise SshFails(f"ssh cannot expand IdentityFile {name}: {_last(err)}")
                name = parse_g(out)["controlpath"][0]
            elif name.startswith("~/"):
                name = self.home.rstrip("/") + "/" + name[2:].lstrip("/")
            files.append(name)
        return tuple(files)


UNSAFE = "UNSAFE: "  # ssh hands the jump's words to the shell unquoted: clusterrun refuses those on purpose
SHELL_SAFE = "@%+=:,./-_[]"


def _nested_argv(command: str) -> Tuple[Optional[str], Optional[int], Optional[str], str]:
    """(-l, -p, -J, host) of the nested ssh, split as the shell splits ssh's command; where the shell would
    split or reinterpret a word (a quote, a space, a ;), ssh runs something else than a jump."""
    head, _, rest = command.partition(" -W '")
    words = head.split(" ")[1:-2] + [rest.rpartition("' ")[2]]  # the -l -p -J values and the hop, not -F CFG
    if any(not (c.isalnum() or c in SHELL_SAFE) for w in words for c in w):
        raise SshFails(UNSAFE + f"the shell would split or reinterpret ssh's jump command {command!r}")
    words = shlex.split(command)
    found: Dict[str, str] = {}
    i = 1
    while i < len(words) - 1:
        found[words[i]] = words[i + 1]
        i += 2
    port = found.get("-p")
    return found.get("-l"), int(port) if port else None, found.get("-J"), words[-1]


def _user_host_port(spec: str) -> Tuple[str, str, Optional[int]]:
    """[user@]host[:port] as `ssh -G` prints a ProxyJump's last hop (a numeric host in brackets)."""
    user, _, rest = spec.rpartition("@")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = tail.lstrip(":")
    else:
        host, _, port = rest.partition(":")
    return user, host, int(port) if port else None


def _last(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and "Pseudo-terminal" not in ln]
    return (lines[-1] if lines else "").strip()[:300]


# ------------------------------------------------------------------ clusterrun's side


class Routed:
    """Stands in for the subprocess module in clusterrun.transport.openssh: ssh runs in the harness's namespace
    (the same cache as the oracle's, so each ssh -G runs once)."""

    DEVNULL = subprocess.DEVNULL
    PIPE = subprocess.PIPE
    SubprocessError = subprocess.SubprocessError
    TimeoutExpired = subprocess.TimeoutExpired
    CompletedProcess = subprocess.CompletedProcess

    def __init__(self, runner: SshRunner):
        self.runner = runner

    def run(self, argv, **kw):
        env = dict(kw.get("env") or os.environ)
        rc, out, err = self.runner.run(list(argv), env)
        return subprocess.CompletedProcess(list(argv), rc, out, err)


def make_host(alias: str, user: Optional[str], port: Optional[int]):
    from clusterrun.config.inventory import Host

    return Host(name="h", host=alias, addr=None, slots=1, connection="ssh", user=user, port=port,
                identity_file=None, known_hosts=None, host_key_policy="strict", python="python3",
                workdir="~/cr", env={}, proxy_jump=None, source="test")


def clusterrun_answer(alias: str, user: Optional[str], port: Optional[int]) -> Answer:
    """clusterrun's target for the lookup, through transport.openssh.config_options as a launch gets it."""
    from clusterrun.config.ssh_config import ssh_target
    from clusterrun.errors import ClusterrunError
    from clusterrun.transport import openssh

    try:
        target = ssh_target(make_host(alias, user, port), openssh.config_options())
    except ClusterrunError as exc:
        return Answer(refused=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a crash is a difference too
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return Answer(crashed=f"{type(exc).__name__}: {exc} ({os.path.basename(frame.filename)}:{frame.lineno})")
    hops = [_hop(j, j.proxy_command) for j in target.jumps]
    return Answer(tuple(hops + [_hop(target, None if target.jumps else target.proxy_command)]))


def _hop(t, proxy: Optional[str]) -> Hop:
    ids = tuple(t.identity_files) if (t.identity_files or t.identity_explicit) else "defaults"
    return Hop(t.hostname, t.port, t.user, ids, proxy or None)


# ------------------------------------------------------------------ the corpus


@dataclass
class Tally:
    agree: int = 0
    deliberate: int = 0
    differ: int = 0
    uncompared: int = 0
    details: List[str] = field(default_factory=list)
    by_kind: Dict[str, List[int]] = field(default_factory=dict)


def run_corpus(cases, runner: SshRunner, mp, workdir: str, modes=("ssh", "own")) -> Tally:
    """Every lookup of every case, in both modes, compared field by field with the oracle."""
    from clusterrun.transport import openssh

    tally = Tally()
    home = pwd.getpwuid(os.getuid()).pw_dir
    mp.setenv("HOME", home)
    if runner.local_hostname:
        import socket

        mp.setattr(socket, "gethostname", lambda: runner.local_hostname)
    for number, case in enumerate(cases):
        folder = os.path.join(workdir, f"case{number:03d}")
        cfg = case.write(folder)
        env = dict(os.environ, **case.env, CLUSTERRUN_SSH_CONFIG=cfg)
        for name in case.unset:
            env.pop(name, None)
        if case.needs_dns and not runner.private:  # ssh would ask DNS: neither side is run
            tally.uncompared += len(case.lookups) * len(modes)
            continue
        oracle = Oracle(runner, cfg, env)
        expected = {lk: oracle.answer(lk.alias, lk.user, lk.port) for lk in case.lookups}
        with mp.context() as m:
            for key, value in case.env.items():
                m.setenv(key, value)
            for key in case.unset:
                m.delenv(key, raising=False)
            m.setenv("CLUSTERRUN_SSH_CONFIG", cfg)
            _stub_resolver(m, openssh)
            for mode in modes:
                with m.context() as mm:
                    if mode == "own":
                        mm.setattr(openssh.shutil, "which", lambda name: None)
                    else:
                        mm.setattr(openssh, "subprocess", Routed(runner))
                    for lk in case.lookups:
                        _tally(tally, case, lk, mode, expected[lk], clusterrun_answer(lk.alias, lk.user, lk.port))
    return tally


def _stub_resolver(m, openssh) -> None:
    """clusterrun's own canonicalization resolves through the harness's hosts table, never through DNS."""
    from sshconfig_cases import HOSTS

    table = {}
    for addr, names in HOSTS:
        for n in names:
            table.setdefault(n.lower(), (addr, names[0]))
    if hasattr(openssh, "resolve_name"):
        m.setattr(openssh, "resolve_name", lambda name: table.get(name.lower().rstrip(".")) if name.endswith(".")
                  else table.get(name.lower()))


def _tally(tally: Tally, case, lk, mode: str, expected: Answer, got: Answer) -> None:
    kind = tally.by_kind.setdefault(case.kind, [0, 0, 0])
    same = (expected.ok and got.ok and expected.chain == got.chain) or \
        (not expected.ok and not expected.refused.startswith(UNSAFE) and got.refused != "")
    if same:
        tally.agree += 1
        kind[0] += 1
        return
    if got.refused and (expected.refused.startswith(UNSAFE) or (case.deliberate and expected.ok)):
        tally.deliberate += 1
        kind[1] += 1
        return
    tally.differ += 1
    kind[2] += 1
    tally.details.append(f"[{mode}] {case.kind} / {case.name}: {lk}\n    ssh:        {expected.show()}\n"
                         f"    clusterrun: {got.show()}")


def main(argv: Sequence[str] = ()) -> int:
    import argparse

    import pytest

    import sshconfig_cases

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated", type=int, default=120)
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--show", action="store_true", help="print every difference")
    args = parser.parse_args(list(argv))
    cases = sshconfig_cases.hand_written() + sshconfig_cases.generated(args.generated, args.seed)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        runner = SshRunner(tmp, sshconfig_cases.HOSTS)
        try:
            tally = run_corpus(cases, runner, mp, tmp)
        finally:
            runner.close()
    lookups = sum(len(c.lookups) for c in cases)
    print(f"{len(cases)} configs ({len(sshconfig_cases.hand_written())} by hand, {args.generated} generated), "
          f"{lookups} lookups x 2 (ssh on PATH, no ssh): agree {tally.agree}, differ {tally.differ}, "
          f"refused on purpose {tally.deliberate}, not compared {tally.uncompared}; {runner.calls} ssh runs; "
          f"private namespace: {runner.private}")
    for kind, (a, d, x) in sorted(tally.by_kind.items()):
        print(f"  {kind:28} agree {a:4}  deliberate {d:3}  differ {x:4}")
    if args.show:
        print("\n".join(tally.details))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv[1:]))
