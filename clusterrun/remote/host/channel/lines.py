"""What travels on the hosts' own channels (see __init__): JSON lines of at most MAX_LINE bytes, and bytes
read exactly by a deadline. Nothing in a line from the network is trusted: anything that is not a JSON
object of ours is a ProtocolError, and the connection it came on is dropped, nothing else."""

import json
import time

from ..wire import read_exact

MAX_LINE = 4096
MAX_BRACKETS = 32  # a line with more `[` and `{` than this is not one of ours (and could nest too deep)
MAX_KEYS = 8


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
    return (json.dumps(obj) + "\n").encode()


class Line:
    """A non-blocking socket with JSON lines in and out. `heard`: when the last line came."""

    def __init__(self, sock, peer_ip=""):
        self.sock = sock
        self.sock.setblocking(False)
        self.peer_ip = peer_ip
        self.buf = b""
        self.closed = False
        self.heard = time.time()

    def fileno(self):
        return self.sock.fileno()

    def send(self, obj):
        try:
            self.sock.sendall(pack(obj))
        except OSError:  # includes a full send buffer: the other end stopped reading
            self.close()

    def receive(self):
        """Every whole message that has arrived; ProtocolError on garbage (the caller drops the line)."""
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
            if len(self.buf) > 2 * MAX_LINE and b"\n" not in self.buf:
                raise ProtocolError("a line longer than %d bytes" % MAX_LINE)
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg = parse_line(line)
            if msg is None:
                raise ProtocolError("a line that is not a JSON object of ours")
            out.append(msg)
            self.heard = time.time()
        return out

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def recv_exact(sock, n, deadline, error, during="the handshake"):
    """Exactly n bytes from a blocking socket by deadline (time.monotonic()); error(text) otherwise."""
    import socket

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
    import socket

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
