"""The listening end's door, for every protocol of the kit (see __init__): accept, close at once what
comes from an address that is not allowed, challenge the rest, give each HELLO_TIMEOUT seconds to send a
hello that proves the token, welcome it (and, for a line protocol, seal the connection: lines.Line.seal).
Whatever a connection sends, only that connection goes: a refusal is counted, the first few are logged,
the last few kept (a blocking wait that ends with nobody let in names them).

Waiting places (unauthenticated connections) are few, and shared so that nobody can hold them against
the real joiners (issue 32: another user on one of the run's hosts, connecting from its address):
  - each allowed address has its own share of them (at least PER_SOURCE): a flood from one address takes
    no place of another's;
  - a new connection is never turned away for want of room: at its address's share, that address's
    oldest waiting connection makes way; with every place taken, the address that holds the most gives
    up its oldest. An idle flood from the joiner's own address pushes out only itself, since a real
    joiner proves itself within one round trip;
  - there are at least two places for each node still expected (not yet let in).
"""

import time

from .handshake import Listening
from .lines import Line

HELLO_TIMEOUT = 3.0  # an unauthenticated connection gets this long to prove itself
MAX_PENDING = 16  # unauthenticated connections at a time (at least two per node still expected)
PER_SOURCE = 4  # the least share of them one address has
REFUSALS_LOGGED = 20
REFUSALS_KEPT = 3


def plain_ip(address):
    """An IPv4 peer of an IPv6 socket is ::ffff:a.b.c.d: the address is a.b.c.d."""
    return address[7:] if address.startswith("::ffff:") else address


class Gatekeeper:
    """server: a listening socket (made non-blocking); terms: the handshake's (handshake.Terms); expect:
    the nodes that may join; allow: the addresses they may come from (empty: any); log(text): where the
    first refusals go."""

    def __init__(self, server, terms, expect, allow=(), log=None, max_pending=MAX_PENDING,
                 timeout=HELLO_TIMEOUT, sealed=True):
        """sealed: a line protocol's (the mesh, the waiters): every line after the welcome carries a MAC;
        not for the relay and the bandwidth test, whose raw bytes follow the welcome."""
        self.server = server
        self.server.setblocking(False)
        self.terms, self.expect, self.allow = terms, set(expect), set(allow)
        self.log = log
        self.max_pending, self.timeout, self.sealed = max_pending, timeout, sealed
        self.pending = {}  # Line -> (its handshake, since: time.monotonic())
        self.joined = set()  # nodes let in at least once
        self.refused = 0
        self.refusals = []  # the last REFUSALS_KEPT reasons

    def places(self):
        """How many connections may wait to prove themselves now."""
        return max(self.max_pending, 2 * len(self.expect - self.joined))

    def share(self):
        """How many of them one address may hold."""
        return max(PER_SOURCE, self.places() // len(self.allow)) if self.allow else PER_SOURCE

    def tick(self):
        """Who got in since the last call: [(node, Line, hello)], each welcomed already (non-blocking)."""
        self._accept()
        admitted = []
        for line, (handshake, since) in list(self.pending.items()):
            try:
                got = self._greet(line, handshake, since)
            except Exception as exc:  # noqa: BLE001 - whatever one connection sends, only it can go
                self.refuse(line.peer_ip, "%s: %s" % (type(exc).__name__, exc))
                self.drop(line)
                continue
            if got is not None:
                admitted.append(got)
        return admitted

    def admit_one(self, wait):
        """Block (select) until the first proven joiner, (node, Line, hello), or None after wait seconds;
        the connections still waiting are closed either way."""
        import select

        deadline = time.monotonic() + wait
        try:
            while True:
                admitted = self.tick()
                if admitted:
                    for _, other, _ in admitted[1:]:
                        other.close()
                    return admitted[0]
                now = time.monotonic()
                if now >= deadline:
                    return None
                soonest = min([since + self.timeout for _, since in self.pending.values()] + [deadline])
                select.select([self.server] + list(self.pending), [], [], max(0.01, soonest - now))
        finally:
            self.close_pending()

    def refuse(self, ip, why, logged=True):
        self.refusals = (self.refusals + ["a connection from %s: %s" % (ip or "?", why)])[-REFUSALS_KEPT:]
        if not logged:
            return
        self.refused += 1
        if self.log is not None and self.refused <= REFUSALS_LOGGED:
            self.log("refused a connection from %s: %s" % (ip or "?", why))

    def drop(self, line):
        line.close()
        self.pending.pop(line, None)

    def close_pending(self):
        for line in list(self.pending):
            self.drop(line)

    def _accept(self):
        while True:
            try:
                sock, addr = self.server.accept()
            except (BlockingIOError, InterruptedError, OSError):
                return
            ip = plain_ip(addr[0])
            if self.allow and ip not in self.allow:
                sock.close()
                self.refuse(ip, "not one of the expected hosts")
                continue
            self._make_room(ip)
            line = Line(sock, ip)
            handshake = Listening(self.terms)
            line.send(handshake.challenge())
            self.pending[line] = (handshake, time.monotonic())

    def _make_room(self, ip):
        """Room for one more waiting connection from ip (see the top): someone's oldest may make way."""
        mine = [line for line in self.pending if line.peer_ip == ip]
        if len(mine) >= self.share():
            why = "made way for a newer connection from the same address"
        elif len(self.pending) >= self.places():
            counts = {}
            for line in self.pending:
                counts[line.peer_ip] = counts.get(line.peer_ip, 0) + 1
            most = max(counts, key=counts.get)
            mine = [line for line in self.pending if line.peer_ip == most]
            why = "made way for a connection from another address (every place was taken)"
        else:
            return
        oldest = min(mine, key=lambda line: self.pending[line][1])
        self.refuse(oldest.peer_ip, why)
        self.drop(oldest)

    def _greet(self, line, handshake, since):
        for msg in line.receive():
            node = handshake.check_hello(msg, self.expect)
            del self.pending[line]
            line.send(handshake.welcome(node, msg))
            if self.sealed:
                line.seal(handshake.session_key(node, msg), "L", self.log)
            self.joined.add(node)
            return node, line, msg
        if line.closed or time.monotonic() - since > self.timeout:
            self.refuse(line.peer_ip, "closed in the handshake" if line.closed else "no hello within %gs"
                        % self.timeout, logged=False)
            self.drop(line)
        return None
