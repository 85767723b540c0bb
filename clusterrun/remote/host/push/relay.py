"""Relay push, the host-to-host part: every host of a push listens on an ephemeral port; in the chain the
controller lays out, a host connects to the next one and forwards, while it receives them, the objects
that host (and the ones after it) still need. Objects are checked against their SHA-256 on every host
before they enter its cache (receive.py), so a host in the middle can pass bytes on but never get a
wrong object into another host's cache.

Both ends prove they hold the per-push token the controller handed each of them over SSH (a keyed
BLAKE2b MAC, mac.py, over the other end's fresh nonce, the run id and the downstream host's place in
the chain); a connection that cannot is closed before any object byte moves. The bytes themselves are not encrypted
(neither is gloo's or NCCL's traffic); `push: {relay: false}` keeps every byte on the SSH channels.

Handshake (downstream = the listening end):
  downstream → upstream  MAGIC + nonce_d (16 bytes)
  upstream → downstream  nonce_u (16) + MAC(token, "up" | nonce_d | run | node)
  downstream → upstream  MAC(token, "down" | nonce_u | run | node)

The listener is bound to the host's own address and takes connections from the upstream host's address
only; it runs several handshakes at once (at most MAX_PENDING, each HANDSHAKE_S seconds), so a silent
or hostile connection costs the real upstream nothing: the first that proves the token is the one.
"""

import os
import select
import socket
import time

from ..mac import same, tag
from ..net import resolve_all, source_for

MAGIC = b"CRRELAY1"
NONCE = 16
MAC = 32
MAX_PENDING = 8
HANDSHAKE_S = 3.0


class RelayError(Exception):
    """The relay path failed here (unreachable, refused, wrong token, cut off): fall back to a direct push."""


def _mac(token, side, nonce, run, node):
    return tag(token, b"|".join([side, nonce, run.encode(), str(node).encode()]))


def _read(sock, n, deadline):
    out = bytearray()
    while len(out) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(n - len(out))
        except socket.timeout:
            raise RelayError("no answer in the handshake") from None
        if not chunk:
            raise RelayError("the other end closed the connection in the handshake")
        out += chunk
    return bytes(out)


def accept_upstream(server, token, run, node, wait, upstream=""):
    """The upstream host's connection, once it proved the token; RelayError when none does in time.
    upstream: its address (only connections from it are let in; any when it is not given)."""
    allow = resolve_all([upstream]) if upstream else set()
    deadline = time.monotonic() + wait
    server.setblocking(False)
    pending = {}  # socket -> _Handshake
    refused = []
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([server] + list(pending), [], [], _next_wake(pending, deadline))
            if server in ready:
                _take(server, pending, allow, refused)
            for conn in [c for c in ready if c is not server]:
                done = pending[conn].step(token, run, node)
                if done:
                    del pending[conn]
                    conn.setblocking(True)
                    return conn
            _expire(pending, refused)
    finally:
        for conn in pending:
            conn.close()
    why = "; ".join(refused[-3:])
    raise RelayError("the upstream host did not connect within %gs%s" % (wait, (" (%s)" % why) if why else ""))


def _next_wake(pending, deadline):
    soonest = min([h.deadline for h in pending.values()] + [deadline])
    return max(0.01, soonest - time.monotonic())


def _take(server, pending, allow, refused):
    try:
        conn, peer = server.accept()
    except (BlockingIOError, InterruptedError, OSError):
        return
    ip = peer[0][7:] if peer[0].startswith("::ffff:") else peer[0]
    if (allow and ip not in allow) or len(pending) >= MAX_PENDING:
        conn.close()
        refused.append("a connection from %s refused (%s)" % (ip, "not the upstream host" if allow and ip not in
                                                                    allow else "too many at once"))
        return
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = _Handshake(conn, ip)
        conn.sendall(MAGIC + handshake.nonce_d)
    except OSError:
        conn.close()
        return
    conn.setblocking(False)
    pending[conn] = handshake


def _expire(pending, refused):
    now = time.monotonic()
    for conn, handshake in list(pending.items()):
        if handshake.failed or now > handshake.deadline:
            refused.append(handshake.failed or "a connection from %s said nothing in time" % handshake.ip)
            conn.close()
            del pending[conn]


class _Handshake:
    """The listening end of one handshake, fed as bytes arrive (non-blocking)."""

    def __init__(self, conn, ip):
        self.conn, self.ip = conn, ip
        self.nonce_d = os.urandom(NONCE)
        self.buf = b""
        self.deadline = time.monotonic() + HANDSHAKE_S
        self.failed = ""

    def step(self, token, run, node):
        """True once the other end proved the token (and got our proof back)."""
        try:
            chunk = self.conn.recv(NONCE + MAC - len(self.buf))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self.failed = "a connection from %s failed: %s" % (self.ip, exc)
            return False
        if not chunk:
            self.failed = "a connection from %s closed in the handshake" % self.ip
            return False
        self.buf += chunk
        if len(self.buf) < NONCE + MAC:
            return False
        nonce_u, mac = self.buf[:NONCE], self.buf[NONCE:]
        if not same(mac, _mac(token, b"up", self.nonce_d, run, node)):
            self.failed = "a connection from %s did not prove the push's token: refused" % self.ip
            return False
        try:
            self.conn.setblocking(True)
            self.conn.sendall(_mac(token, b"down", nonce_u, run, node))
        except OSError as exc:
            self.failed = "a connection from %s failed: %s" % (self.ip, exc)
            return False
        return True


def connect_downstream(addr, port, token, run, node, wait, source=""):
    """A connection to the next host in the chain (from this host's own address, the one it lets in),
    both ends authenticated; RelayError otherwise."""
    deadline = time.monotonic() + wait
    try:
        local = source_for(source, addr)
        conn = socket.create_connection((addr, port), timeout=wait, source_address=(local, 0) if local else None)
    except OSError as exc:
        raise RelayError("cannot reach %s:%d: %s" % (addr, port, exc.strerror or exc)) from None
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = _read(conn, len(MAGIC) + NONCE, deadline)
        if not hello.startswith(MAGIC):
            raise RelayError("%s:%d is not a clusterrun relay" % (addr, port))
        nonce_u = os.urandom(NONCE)
        conn.sendall(nonce_u + _mac(token, b"up", hello[len(MAGIC):], run, node))
        try:
            proof = _read(conn, MAC, deadline)
        except RelayError as exc:
            raise RelayError("%s:%d did not accept the push's token (%s)" % (addr, port, exc)) from None
        if not same(proof, _mac(token, b"down", nonce_u, run, node)):
            raise RelayError("%s:%d did not prove the push's token" % (addr, port))
        conn.settimeout(None)
        return conn
    except (RelayError, OSError) as exc:
        conn.close()
        raise RelayError(str(exc)) from None


class SocketSource:
    """Object bytes from the upstream host; readinto(view) like a file, RelayError on silence or EOF."""

    def __init__(self, sock, timeout):
        self.sock = sock
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.bytes = 0

    def readinto(self, view):
        try:
            n = self.sock.recv_into(view)
        except socket.timeout:
            raise RelayError("the upstream host sent nothing for %gs" % self.timeout) from None
        except OSError as exc:
            raise RelayError("the upstream connection failed: %s" % (exc.strerror or exc)) from None
        if n == 0:
            raise RelayError("the upstream host closed the connection mid-push")
        self.bytes += n
        return n

    def close(self):
        self.sock.close()
