"""The listening end's door, for every protocol of the kit (see __init__): accept, close at once what
comes from an address that is not allowed or finds every waiting place taken, challenge the rest, give
each HELLO_TIMEOUT seconds to send a hello that proves the token, welcome it. Whatever a connection
sends, only that connection goes: a refusal is counted, the first few are logged, the last few kept (a
blocking wait that ends with nobody let in names them)."""

import time

from .handshake import Listening
from .lines import Line

HELLO_TIMEOUT = 3.0  # an unauthenticated connection gets this long to prove itself
MAX_PENDING = 16  # unauthenticated connections at a time; more are closed at once
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
                 timeout=HELLO_TIMEOUT):
        self.server = server
        self.server.setblocking(False)
        self.terms, self.expect, self.allow = terms, set(expect), set(allow)
        self.log = log
        self.max_pending, self.timeout = max_pending, timeout
        self.pending = {}  # Line -> (its handshake, since: time.monotonic())
        self.refused = 0
        self.refusals = []  # the last REFUSALS_KEPT reasons

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
            why = self._turned_away(ip)
            if why:
                sock.close()
                self.refuse(ip, why)
                continue
            line = Line(sock, ip)
            handshake = Listening(self.terms)
            line.send(handshake.challenge())
            self.pending[line] = (handshake, time.monotonic())

    def _turned_away(self, ip):
        """Why a new connection from ip is closed before its challenge, or None."""
        if self.allow and ip not in self.allow:
            return "not one of the expected hosts"
        if len(self.pending) >= self.max_pending:
            return "too many connections waiting to prove themselves"
        return None

    def _greet(self, line, handshake, since):
        for msg in line.receive():
            node = handshake.check_hello(msg, self.expect)
            del self.pending[line]
            line.send(handshake.welcome(node, msg))
            return node, line, msg
        if line.closed or time.monotonic() - since > self.timeout:
            self.refuse(line.peer_ip, "closed in the handshake" if line.closed else "no hello within %gs"
                        % self.timeout, logged=False)
            self.drop(line)
        return None
