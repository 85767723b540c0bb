"""Relay push, the host-to-host part: every host of a push listens on an ephemeral port; in the chain the
controller lays out, a host connects to the next one and forwards, while it receives them, the objects
that host (and the ones after it) still need. Objects are checked against their SHA-256 on every host
before they enter its cache (receive.py), so a host in the middle can pass bytes on but never get a
wrong object into another host's cache.

Both ends prove they hold the per-push token the controller handed each of them over SSH (HMAC-SHA256
over the other end's fresh nonce, the run id and the downstream host's place in the chain); a
connection that cannot is closed before any object byte moves. The bytes themselves are not encrypted
(neither is gloo's or NCCL's traffic); `push: {relay: false}` keeps every byte on the SSH channels.

Handshake (downstream = the listening end):
  downstream → upstream  MAGIC + nonce_d (16 bytes)
  upstream → downstream  nonce_u (16) + HMAC(token, "up" | nonce_d | run | node)
  downstream → upstream  HMAC(token, "down" | nonce_u | run | node)
"""

import hashlib
import hmac
import os
import socket
import time

MAGIC = b"CRRELAY1"
NONCE = 16
MAC = 32


class RelayError(Exception):
    """The relay path failed here (unreachable, refused, wrong token, cut off): fall back to a direct push."""


def _mac(token, side, nonce, run, node):
    return hmac.new(token.encode(), b"|".join([side, nonce, run.encode(), str(node).encode()]),
                    hashlib.sha256).digest()


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


def accept_upstream(server, token, run, node, wait):
    """The upstream host's connection, once it proved the token; RelayError when none does in time."""
    deadline = time.monotonic() + wait
    while True:
        server.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            conn, peer = server.accept()
        except socket.timeout:
            raise RelayError("the upstream host did not connect within %gs" % wait) from None
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce_d = os.urandom(NONCE)
            conn.sendall(MAGIC + nonce_d)
            reply = _read(conn, NONCE + MAC, min(deadline, time.monotonic() + 10))
            nonce_u, mac = reply[:NONCE], reply[NONCE:]
            if not hmac.compare_digest(mac, _mac(token, b"up", nonce_d, run, node)):
                raise RelayError("a connection from %s did not prove the push's token: refused" % (peer[0],))
            conn.sendall(_mac(token, b"down", nonce_u, run, node))
            return conn
        except (RelayError, OSError) as exc:
            conn.close()
            if time.monotonic() >= deadline:
                raise RelayError(str(exc)) from None
            # someone else knocked (a port scan, a wrong token): keep waiting for the real upstream


def connect_downstream(addr, port, token, run, node, wait):
    """A connection to the next host in the chain, both ends authenticated; RelayError otherwise."""
    deadline = time.monotonic() + wait
    try:
        conn = socket.create_connection((addr, port), timeout=wait)
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
        if not hmac.compare_digest(proof, _mac(token, b"down", nonce_u, run, node)):
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
