"""SSH connections with paramiko: ~/.ssh/config, ProxyJump, identity files and the agent, strict host
keys, and a deadline on every step (connect, banner, key exchange, auth, channel open, exec, read).

Why a bare `paramiko.Transport` and not `SSHClient`/fabric's `Connection`: we need TCP_NODELAY on the
socket (halves the per-connection time), a cipher preference (AES-GCM streams fastest), the key types
on record offered first, and our own host-key policy; fabric's Connection installs an auto-add policy
on construction. A ProxyJump hop is what fabric's gateway does: a `direct-tcpip` channel used as socket.
"""

from __future__ import annotations

import os
import random
import shlex
import logging
import socket
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import paramiko  # transport/__init__ keeps invoke out of this import
from paramiko.common import cMSG_CHANNEL_REQUEST
from paramiko.message import Message

from ..config.inventory import Timeouts
from ..config.ssh_config import SshTarget
from ..errors import AuthError, ConnectError, Dropped, HostKeyChanged, NothingListens
from . import Completed, StreamClosed, run_on
from .proxy import ShellProxyCommand
from .hostkeys import KnownHosts
from .pacing import gate

# paramiko's transport threads log what they hit (a proxy that died, a banner timeout) as tracebacks; each
# such failure reaches the user once, as a ConnectError naming the host, not as a second copy from a thread
logging.getLogger("paramiko").addHandler(logging.NullHandler())

WINDOW = 8 << 20  # a larger channel window keeps a fast log or push stream from stalling on round trips
_PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")
_DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")

_key_cache: Dict[str, paramiko.PKey] = {}
_key_lock = threading.Lock()


def _load_key(path: str) -> Optional[paramiko.PKey]:
    """Keys are parsed once per process (an RSA key costs 100-200 ms of CPU each time)."""
    with _key_lock:
        if path in _key_cache:
            return _key_cache[path]
    try:
        key = paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        key = None  # encrypted: only ssh-agent can use it without a prompt
    with _key_lock:
        _key_cache[path] = key
    return key


def _exec(channel: paramiko.Channel, command: str, timeout: float) -> None:
    """Channel.exec_command with a deadline: paramiko waits for the reply without one, so a paused host
    would hang the controller forever."""
    m = Message()
    m.add_byte(cMSG_CHANNEL_REQUEST)
    m.add_int(channel.remote_chanid)
    m.add_string("exec")
    m.add_boolean(True)
    m.add_string(command)
    channel._event_pending()
    channel.transport._send_user_message(m)
    if not channel.event.wait(timeout):
        raise TimeoutError
    if not channel.event_ready:
        raise StreamClosed("the host refused to run the command")


class SshStream:
    def __init__(self, channel: paramiko.Channel):
        self._ch = channel

    def write(self, data: bytes, timeout: Optional[float] = None) -> None:
        # Channel.sendall slices what is left of its argument after every packet (32 KiB), copying the rest
        # each time: quadratic in the size of a write. Packets cut from a memoryview copy nothing.
        view = memoryview(data)
        try:
            self._ch.settimeout(timeout)
            while view:
                sent = self._ch.send(view[:1 << 20])
                if sent == 0:
                    raise StreamClosed("the channel closed")
                view = view[sent:]
        except socket.timeout:
            raise TimeoutError from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise StreamClosed(str(exc) or type(exc).__name__) from None

    def close_stdin(self) -> None:
        try:
            self._ch.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def read(self, n: int, timeout: Optional[float]) -> bytes:
        self._ch.settimeout(timeout)
        try:
            return self._ch.recv(n)
        except socket.timeout:
            raise TimeoutError from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise StreamClosed(str(exc) or type(exc).__name__) from None

    def wait(self, timeout: Optional[float]) -> int:
        if not self._ch.status_event.wait(timeout):
            raise TimeoutError
        return self._ch.exit_status  # -1: the channel closed without a status (connection lost)

    def stderr(self) -> bytes:
        parts = []
        while self._ch.recv_stderr_ready():
            parts.append(self._ch.recv_stderr(1 << 16))
        return b"".join(parts)

    def close(self) -> None:
        try:
            self._ch.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


class SshTunnel:
    """A direct-tcpip channel (what `ssh -L` opens per connection), non-blocking for one select loop."""

    def __init__(self, channel: paramiko.Channel):
        self._ch = channel
        self._ch.settimeout(0.0)

    def fileno(self) -> int:
        return self._ch.fileno()  # a pipe paramiko makes readable when data (or the end) arrives

    def recv(self, n: int) -> bytes:
        try:
            return self._ch.recv(n)
        except socket.timeout:
            raise BlockingIOError from None
        except (OSError, EOFError, paramiko.SSHException):
            return b""

    def send(self, data: bytes) -> int:
        try:
            return self._ch.send(data)
        except socket.timeout:
            return 0
        except (EOFError, paramiko.SSHException) as exc:
            raise OSError(str(exc) or type(exc).__name__) from None

    def writable(self) -> bool:
        return self._ch.send_ready()

    def shutdown_write(self) -> None:
        try:
            self._ch.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def close(self) -> None:
        try:
            self._ch.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


class SshTransport:
    def __init__(self, label: str, transport: paramiko.Transport, timeouts: Timeouts,
                 hops: Sequence[paramiko.Transport] = ()):
        self.label = label
        self._t = transport
        self._timeouts = timeouts
        self._hops = list(hops)

    @property
    def alive(self) -> bool:
        return self._t.is_active()

    def open(self, argv: Sequence[str]) -> SshStream:
        try:
            channel = self._t.open_session(window_size=WINDOW, timeout=self._timeouts.connect)
            _exec(channel, shlex.join(argv), self._timeouts.connect)
        except TimeoutError:
            raise ConnectError(self.label, f"no answer to a new command within {self._timeouts.connect:g} s "
                                           "(host hung or cut off?)") from None
        except (paramiko.SSHException, OSError, EOFError, StreamClosed) as exc:
            raise ConnectError(self.label, f"cannot start a command: {exc or type(exc).__name__}") from None
        return SshStream(channel)

    def run(self, argv: Sequence[str], *, stdin: Optional[bytes] = None, timeout: float) -> Completed:
        return run_on(self, argv, stdin=stdin, timeout=timeout)

    def tunnel(self, port: int) -> SshTunnel:
        """localhost:PORT as the host sees it, through this connection (its jumps, keys and config)."""
        try:
            channel = self._t.open_channel("direct-tcpip", ("localhost", port), ("127.0.0.1", 0),
                                           window_size=WINDOW, timeout=self._timeouts.connect)
        except paramiko.ChannelException as exc:  # sshd could not connect: nothing listens there
            raise NothingListens(self.label, port, exc.text) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(self.label, f"cannot open a tunnel to localhost:{port}: "
                                           f"{exc or type(exc).__name__}") from None
        return SshTunnel(channel)

    def close(self) -> None:
        for t in [self._t] + self._hops[::-1]:
            sock = t.sock
            try:
                if isinstance(sock, socket.socket):
                    sock.shutdown(socket.SHUT_RDWR)  # else close() lingers ~80 ms
            except OSError:
                pass
            t.close()


def _prefer_ciphers(t: paramiko.Transport) -> None:
    opts = t.get_security_options()
    opts.ciphers = tuple(c for c in _PREFERRED_CIPHERS if c in opts.ciphers) + \
        tuple(c for c in opts.ciphers if c not in _PREFERRED_CIPHERS)


def _prefer_key_types(t: paramiko.Transport, offered: Sequence[str]) -> None:
    """Ask for the host key types known_hosts holds for this host (those paramiko can use): the key the host
    shows is then one the record can check."""
    if offered:
        usable = tuple(k for k in offered if k in t._preferred_keys)
        if usable:
            t.get_security_options().key_types = usable


def _start_client(t: paramiko.Transport, target: SshTarget, label: str, offered: Sequence[str],
                  timeout: float) -> None:
    """The key exchange; the transport is closed where it fails."""
    t0 = time.monotonic()
    try:
        t.start_client(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        t.close()
        text = str(exc) or type(exc).__name__
        if not t.remote_version and time.monotonic() - t0 < min(timeout, 2.0):  # closed at once, no banner
            raise Dropped(label, f"{target.hostname}:{target.port} closed the connection before its SSH banner "
                                 f"({text}; sshd's MaxStartups?)") from None
        if "host key" in text.lower() and offered:
            raise HostKeyChanged(label, f"{target.hostname} no longer offers a host key of the type on record "
                                        f"({', '.join(offered)}): {text}", fingerprint="?",
                                 hint=f"check the host, then update {target.known_hosts}") from None
        raise ConnectError(label, f"SSH handshake with {target.hostname}:{target.port} failed: {text}") from None
    if not t.is_active() or t.host_key is None:
        # start_client returns at its timeout without raising (a paused host answers TCP, then nothing)
        t.close()
        raise ConnectError(label, f"no SSH handshake from {target.hostname}:{target.port} within "
                                  f"{timeout:g} s (host hung?)")


def _identity_keys(target: SshTarget, label: str) -> Tuple[List[Tuple[str, paramiko.PKey]], List[str]]:
    """The identity files' keys (by path; OpenSSH's default keys when none is configured), and the files
    passed over (encrypted ones: the agent may hold them)."""
    tried: List[str] = []
    paths = target.identity_files if target.identity_explicit else \
        tuple(p for p in (os.path.expanduser(d) for d in _DEFAULT_KEYS) if os.path.exists(p))  # IdentityFile none: none
    keys: List[Tuple[str, paramiko.PKey]] = []
    for path in paths:
        if not os.path.exists(path) and target.sources.get("identity") != "inventory":
            continue  # as OpenSSH: a configured key that is not there is passed over
        try:
            key = _load_key(path)
        except (OSError, paramiko.SSHException, ValueError) as exc:
            if target.identity_explicit:
                raise AuthError(label, f"cannot read identity file {path}: {exc}") from None
            continue
        if key is not None:
            keys.append((path, key))
        else:
            tried.append(f"{path} (encrypted: add it to ssh-agent)")
    return keys, tried


def _agent_keys(target: SshTarget, keys: List[Tuple[str, paramiko.PKey]]) -> List[Tuple[str, paramiko.PKey]]:
    try:  # IdentitiesOnly: only the identity files (OpenSSH's meaning)
        return [] if target.identities_only and keys else [("ssh-agent", k) for k in paramiko.Agent().get_keys()]
    except paramiko.SSHException:
        return []


class Connector:
    """Opens SSH connections for the hosts of one run; shares known_hosts files between them."""

    def __init__(self, timeouts: Timeouts):
        self.timeouts = timeouts
        self._known: Dict[str, KnownHosts] = {}
        self._lock = threading.Lock()

    def known_hosts(self, path: str) -> KnownHosts:
        with self._lock:
            if path not in self._known:
                self._known[path] = KnownHosts(path)
            return self._known[path]

    def connect(self, target: SshTarget) -> SshTransport:
        hops: List[paramiko.Transport] = []
        try:
            for hop in target.jumps:  # the first hop may have a ProxyCommand of its own (ssh_config.ssh_target)
                hops.append(self._through_proxy(hop) if hop.proxy_command and not hops else
                            self._reach(hop, target.label, hop.label, via=hops[-1] if hops else None))
            if not target.jumps and target.proxy_command:
                return SshTransport(target.label, self._through_proxy(target), self.timeouts, hops)
            t = self._reach(target, target.label, target.label, via=hops[-1] if hops else None)
        except BaseException:
            for hop in hops:
                hop.close()
            raise
        return SshTransport(target.label, t, self.timeouts, hops)

    def _reach(self, target: SshTarget, label: str, hop_label: str,
               via: Optional[paramiko.Transport]) -> paramiko.Transport:
        """An authenticated connection to target (a jump host or the host itself), paced by its sshd's Gate;
        one turned away at once (Dropped) is tried again, until timeouts.connect has passed."""
        door = gate(target.hostname, target.port)
        deadline = time.monotonic() + self.timeouts.connect
        while True:
            with door:
                sock = self._open_socket(target, label, via=via)
                try:
                    return self._handshake(target, sock, label=hop_label)
                except Dropped:
                    door.dropped()
                    if time.monotonic() >= deadline:
                        raise
            time.sleep(random.uniform(0.05, 0.25))  # the others in flight get through meanwhile

    def _through_proxy(self, target: SshTarget) -> paramiko.Transport:
        """The SSH session over the config's ProxyCommand; when it fails, what the proxy said is shown."""
        try:
            proxy = ShellProxyCommand(target.proxy_command)
        except OSError as exc:
            raise ConnectError(target.label, f"cannot run ProxyCommand {target.proxy_command!r}: {exc}") from None
        try:
            return self._handshake(target, proxy, label=target.label)
        except ConnectError as exc:
            said = proxy.stderr_tail()
            proxy.close()
            if said:
                exc.message += f"; ProxyCommand {target.proxy_command!r} said: {said}"
                exc.args = (str(exc),)
            raise
        except BaseException:
            proxy.close()
            raise

    def _open_socket(self, target: SshTarget, label: str, via: Optional[paramiko.Transport]):
        timeout = self.timeouts.connect
        where = f"{target.hostname}:{target.port}"
        if via is not None:
            try:
                return via.open_channel("direct-tcpip", (target.hostname, target.port), ("", 0), timeout=timeout)
            except (paramiko.SSHException, OSError) as exc:
                raise ConnectError(label, f"the jump host cannot reach {where}: {exc}") from None
        try:
            sock = socket.create_connection((target.hostname, target.port), timeout=timeout)
        except socket.timeout:
            raise ConnectError(label, f"no answer from {where} within {timeout:g} s (connect timeout)") from None
        except socket.gaierror as exc:
            raise ConnectError(label, f"cannot resolve {target.hostname!r}: {exc.strerror}") from None
        except OSError as exc:
            raise ConnectError(label, f"cannot connect to {where}: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _handshake(self, target: SshTarget, sock, label: str) -> paramiko.Transport:
        timeout = self.timeouts.connect
        t = paramiko.Transport(sock)
        t.banner_timeout = t.handshake_timeout = t.auth_timeout = timeout
        t.clear_to_send_timeout = timeout
        _prefer_ciphers(t)
        known = self.known_hosts(target.known_hosts)
        offered = known.negotiable_types(target.hostname, target.port)
        _prefer_key_types(t, offered)
        _start_client(t, target, label, offered, timeout)
        try:
            known.verify(label, target.hostname, target.port, t.get_remote_server_key(), target.host_key_policy)
            self._authenticate(t, target, label)
        except BaseException:
            t.close()
            raise
        t.set_keepalive(15)
        return t

    def _authenticate(self, t: paramiko.Transport, target: SshTarget, label: str) -> None:
        keys, tried = _identity_keys(target, label)
        for source, key in keys + _agent_keys(target, keys):
            try:
                t.auth_publickey(target.user, key)
            except paramiko.BadAuthenticationType as exc:
                raise AuthError(label, f"{target.user}@{target.hostname} does not accept public keys "
                                       f"(allowed: {', '.join(exc.allowed_types)})") from None
            except paramiko.AuthenticationException:
                tried.append(source)
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise ConnectError(label, f"connection lost during authentication: {exc}") from None
            if t.is_authenticated():
                return
        raise AuthError(label, f"no key was accepted for {target.user}@{target.hostname}:{target.port}"
                               f" (tried: {', '.join(tried) or 'no keys found'})",
                        hint="set identity_file in the inventory, or load the key into ssh-agent")

