"""What travels on the hosts' own channels (see __init__): JSON lines of at most MAX_LINE bytes, and bytes
read exactly by a deadline. Nothing in a line from the network is trusted: anything that is not a JSON
object of ours is a ProtocolError, and the connection it came on is dropped, nothing else.

After the handshake a line protocol's connection is sealed (Line.seal): each line is then
    MAC " " JSON        MAC = hex(MAC(SESSION, DIRECTION "|" COUNTER "|" JSON))
SESSION the connection's key (handshake.Terms.session_key: the token's, bound to both nonces),
DIRECTION "L" from the listening end or "J" from the joining end, COUNTER how many lines that end sent on
the connection before this one (0 first; implicit, never on the wire). A line that fails (forged, replayed,
reordered, or from another connection or direction; or longer than any of ours) is dropped and logged,
and moves no counter: the connection and the lines after it go on. A line that passes but is not a message of ours is the
ProtocolError it always was."""

import time

from ..stdlib import json
from ..mac import TAG, same, tag
from ..wire import read_exact

MAX_LINE = 4096
MAX_BRACKETS = 32  # a line with more `[` and `{` than this is not one of ours (and could nest too deep)
MAX_KEYS = 8
FORGED_LOGGED = 20  # per connection


class ProtocolError(Exception):
    """A line that is not the protocol's: the connection it came on is dropped."""


def parse_line(line):
    """A JSON object from one line (bytes, without its newline), or None for anything else (never raises)."""
    if len(line) > MAX_LINE or line.count(b"[") + line.count(b"{") > MAX_BRACKETS:
        return None
    try:
        msg = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return msg if isinstance(msg, dict) and len(msg) <= MAX_KEYS else None


def pack(obj):
    """One unsealed line (the handshake's)."""
    return (json.dumps(obj) + "\n").encode()


class Line:
    """A non-blocking socket with JSON lines in and out. `heard`: when the last (authentic) line came."""

    def __init__(self, sock, peer_ip=""):
        self.sock = sock
        self.sock.setblocking(False)
        self.peer_ip = peer_ip
        self.buf = b""
        self.closed = False
        self.heard = time.time()
        self.key = None  # once sealed: the session's key, the two directions and their counters
        self.says = self.hears = b""
        self.said = self.heard_lines = self.forged = 0
        self.skipping = False  # sealed: inside a line too long to be ours, dropped as it comes
        self.log = None

    def fileno(self):
        return self.sock.fileno()

    def seal(self, key, says, log=None):
        """From now on every line carries its MAC (see above); says: this end's direction, "L" or "J"."""
        self.key, self.says, self.hears = key, says.encode(), (b"J" if says == "L" else b"L")
        self.log = log

    def _mac(self, direction, count, payload):
        return tag(self.key, b"%s|%d|" % (direction, count) + payload).hex().encode()

    def send(self, obj):
        data = json.dumps(obj).encode()
        if self.key is not None:
            data = self._mac(self.says, self.said, data) + b" " + data
            self.said += 1
        try:
            self.sock.sendall(data + b"\n")
        except OSError:  # includes a full send buffer: the other end stopped reading
            self.close()

    def receive(self):
        """Every whole message that has arrived, one at a time (a seal made while they are read holds for
        the rest); ProtocolError on garbage (the caller drops the line)."""
        self._fill()
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg = self._open(line)
            if msg is not None:
                self.heard = time.time()
                yield msg

    def _fill(self):
        while not self.closed:
            try:
                data = self.sock.recv(MAX_LINE + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                break
            if not data:
                self.close()
                break
            self.buf += data
            if self.skipping:
                self._skip()
            if len(self.buf) > 2 * MAX_LINE and b"\n" not in self.buf:
                if self.key is None:
                    raise ProtocolError("a line longer than %d bytes" % MAX_LINE)
                self._forged()  # sealed: none of ours is that long; drop it up to its end, keep the connection
                self.buf, self.skipping = b"", True

    def _skip(self):
        """Drop what is left of an over-long line, up to and with its newline."""
        cut = self.buf.find(b"\n")
        if cut < 0:
            self.buf = b""
        else:
            self.buf, self.skipping = self.buf[cut + 1:], False

    def _open(self, line):
        """The message of one line; None for a sealed line that failed its MAC (dropped, logged)."""
        if self.key is not None:
            mac, payload = line[:2 * TAG], line[2 * TAG + 1:]
            if line[2 * TAG:2 * TAG + 1] != b" " or not same(mac, self._mac(self.hears, self.heard_lines, payload)):
                self._forged()
                return None
            self.heard_lines += 1
            line = payload
        msg = parse_line(line)
        if msg is None:
            raise ProtocolError("a line that is not a JSON object of ours")
        return msg

    def _forged(self):
        self.forged += 1
        if self.log is not None and self.forged <= FORGED_LOGGED:
            self.log("dropped a message on the connection with %s: its MAC failed (forged, replayed or out "
                     "of order)" % (self.peer_ip or "?"))

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def recv_exact(sock, n, deadline, error, during="the handshake"):
    """Exactly n bytes from a blocking socket by deadline (time.monotonic()); error(text) otherwise."""
    from ..stdlib import socket

    def read(k):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            return sock.recv(k)
        except socket.timeout:
            raise error("no answer in %s" % during) from None

    return read_exact(read, n, lambda: error("the other end closed the connection in %s" % during))


def read_line(sock, deadline, error=ProtocolError):
    """One message from a blocking socket by deadline, read no further than its newline (what follows
    may be another protocol's bytes); error(text) when the line is not one of ours, or does not come."""
    from ..stdlib import socket

    data = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            ahead = sock.recv(MAX_LINE + 1 - len(data), socket.MSG_PEEK)
        except socket.timeout:
            raise error("no answer in the handshake") from None
        if not ahead:
            raise error("the other end closed the connection in the handshake")
        end = ahead.find(b"\n")
        data += recv_exact(sock, len(ahead) if end < 0 else end + 1, deadline, error)
        if end >= 0:
            break
        if len(data) > MAX_LINE:
            raise error("a line longer than %d bytes" % MAX_LINE)
    msg = parse_line(data[:-1])
    if msg is None:
        raise error("a line that is not a JSON object of ours")
    return msg
