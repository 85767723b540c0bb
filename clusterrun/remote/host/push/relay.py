"""Relay push, the host-to-host part: every host of a push listens on an ephemeral port; in the chain the
controller lays out, a host connects to the next one and forwards, while it receives them, the objects
that host (and the ones after it) still need. Objects are checked against their SHA-256 on every host
before they enter its cache (receive.py), so a host in the middle can pass bytes on but never get a
wrong object into another host's cache.

Both ends prove they hold the per-push token the controller handed each of them over SSH, by the kit's
handshake (channel/__init__.py: a keyed BLAKE2b MAC, mac.py, over the other end's fresh nonce), before
any object byte moves; a connection that cannot is closed. The bytes themselves are not encrypted
(neither is gloo's or NCCL's traffic); `push: {relay: false}` keeps every byte on the SSH channels.

Handshake (downstream = the listening end), then the objects' bytes, raw, upstream → downstream:
  downstream → upstream  {"challenge", "for": "relay"}
  upstream → downstream  {"hello": NODE, "nonce", "done": false, "mac"}
  downstream → upstream  {"welcome": NODE, "mac"}
  PROTOCOL "relay", CONTEXT the run id, NODE the downstream host's place in the chain.

The listener is bound to the host's own address and its door (channel/gate.py) lets in connections from
the upstream host's address only; it runs several handshakes at once (at most MAX_PENDING, each
HANDSHAKE_S seconds), so a silent or hostile connection costs the real upstream nothing: the first that
proves the token is the one.
"""

import time

from ..stdlib import socket
from ..channel.gate import Gatekeeper
from ..channel.handshake import JoinError, Terms, join
from ..mac import ShortToken
from ..net import resolve_all, source_for

PROTOCOL = "relay"
MAX_PENDING = 8
HANDSHAKE_S = 3.0


class RelayError(Exception):
    """The relay path failed here (unreachable, refused, wrong token, cut off): fall back to a direct push."""


def terms(token, run):
    try:
        return Terms(PROTOCOL, token, run, secret="the push's token")
    except ShortToken as exc:
        raise RelayError(str(exc)) from None


def accept_upstream(server, token, run, node, wait, upstream=""):
    """The upstream host's connection, once it proved the token; RelayError when none does in time.
    upstream: its address (only connections from it are let in; any when it is not given)."""
    gate = Gatekeeper(server, terms(token, run), [node], resolve_all([upstream]) if upstream else (),
                      max_pending=MAX_PENDING, timeout=HANDSHAKE_S, sealed=False)
    admitted = gate.admit_one(wait)
    if admitted is None:
        why = "; ".join(gate.refusals)
        raise RelayError("the upstream host did not connect within %gs%s" % (wait, (" (%s)" % why) if why else ""))
    line = admitted[1]
    if line.buf:  # the upstream sends nothing between its hello and our welcome
        line.close()
        raise RelayError("the upstream host sent bytes before it was welcomed")
    conn = line.sock
    conn.setblocking(True)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


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
        join(conn, terms(token, run), node, deadline)
        conn.settimeout(None)
        return conn
    except JoinError as exc:
        conn.close()
        raise RelayError(_refusal(addr, port, exc)) from None
    except OSError as exc:
        conn.close()
        raise RelayError(str(exc)) from None


def _refusal(addr, port, exc):
    if exc.stage == "challenge":
        return "%s:%d is not a clusterrun relay (%s)" % (addr, port, exc)
    if exc.stage == "accepted":
        return "%s:%d did not accept the push's token (%s)" % (addr, port, exc)
    return "%s:%d did not prove the push's token" % (addr, port)


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
