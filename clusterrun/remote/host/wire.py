"""How the host program talks to the controller: a JSON line on stdout for most commands, framed JSON
messages for the push (4-byte length, then JSON), frames for `follow`, and `Fail` for an expected
failure, answered as {"error", "kind", "path"} in the command's own form (a line, a message, or for
`follow` an F frame: kind "missing" is "no such run here"). The controller's side is hosts/wire.py."""

import struct
import sys

from .stdlib import json

PROTOCOL = 1
FRAME = struct.Struct(">cIQI")  # kind, rank, offset, payload length (follow's frames)
CHUNK = 1 << 20


class Fail(Exception):
    """An expected failure, reported to the controller as JSON {"error", "kind", "path"}."""

    def __init__(self, message, kind="error", path=""):
        Exception.__init__(self, message)
        self.kind = kind
        self.path = path


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


SAY_AFTER = 1.0  # seconds: a wait (for a lock, another launch's claim) longer than this is said with note()


def note(text):
    """A line on stderr for whoever reads it: the controller quotes its tail when the host program does
    not answer in time or its connection ends (hosts/failures.py), so a wait says what it waits for."""
    try:
        sys.stderr.write("%s\n" % text)
        sys.stderr.flush()
    except (OSError, ValueError):  # nobody reads any more
        pass


def fail_frame(obj):
    """An expected failure where the controller reads frames (`follow`): an F frame carrying the answer,
    so it is never taken for the header of a log frame."""
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(FRAME.pack(b"F", 0, 0, len(data)) + data)
    sys.stdout.buffer.flush()


def read_exact(read, n, ended):
    """Exactly n bytes from read(k) (at most k bytes; b"" once its input ended); ended() is the exception
    raised when the input ends first. The one such loop: the framed messages on stdin (here, and within
    a silence: share/session.py), the hosts' own sockets by a deadline (channel/lines.py), and the
    controller's channels (transport/__init__.py)."""
    parts = []
    while n:
        chunk = read(min(n, CHUNK))
        if not chunk:
            raise ended()
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _gone():
    return Fail("the controller went away during the push", "aborted")


def read_msg(stream):
    (n,) = struct.unpack(">I", read_exact(stream.read, 4, _gone))
    return json.loads(read_exact(stream.read, n, _gone).decode())


def send_msg(obj):
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(data)) + data)
    sys.stdout.buffer.flush()
