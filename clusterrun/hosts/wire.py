"""What travels between the controller and the host program: framed JSON messages (the push and its
start) and the frames `follow` sends (log bytes, exit records, heartbeats, the end), parsed from large
reads (a frame per log chunk, not per line). The host side writes them in remote/host/wire.py and observe/follow.py."""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass
from typing import Optional

from ..remote import EXIT_PROGRAM_MISSING
from ..transport import Stream, StreamClosed, read_exact

FRAME = struct.Struct(">cIQI")  # kind, rank, offset, payload length (as remote/host/wire.py packs them)
# The longest payload each kind may have: log frames are at most the host's read size (1 MiB), records a
# few hundred bytes. A header that says more is garbage (a login shell printing text, a broken host), not
# a reason to wait for gigabytes.
MAX_PAYLOAD = {b"L": 4 << 20, b"A": 4 << 20, b"X": 1 << 20, b"H": 1 << 16, b"E": 1 << 16, b"F": 1 << 16}
MSG_LEN = struct.Struct(">I")  # a framed message: its length, then JSON


class ProgramMissing(Exception):
    """The host program is not installed on the host (yet, or in this version). Internal, not a
    ClusterrunError: HostClient._with_program installs the program and tries once more; it never reaches a
    user (a failed install is a RemoteCommandError)."""


def read_msg(stream: Stream, timeout: float) -> dict:
    (n,) = MSG_LEN.unpack(read_exact(stream, MSG_LEN.size, timeout))
    return json.loads(read_exact(stream, n, timeout).decode())


def offer(stream: Stream, message: dict, timeout: float) -> dict:
    """A command's first message out and the host's answer back; ProgramMissing when the channel closed
    because the host lacks the program (the caller installs it and tries again)."""
    try:
        stream.write(pack_msg(message), timeout)
        return read_msg(stream, timeout)
    except StreamClosed:
        if exit_code_of(stream) == EXIT_PROGRAM_MISSING:
            raise ProgramMissing() from None
        raise


def pack_msg(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return MSG_LEN.pack(len(data)) + data


@dataclass(frozen=True)
class Frame:
    kind: str  # "L" log bytes, "A" auxiliary log bytes, "X" exit record, "H" heartbeat, "E" end, "F" failure
    rank: int
    offset: int
    payload: bytes

    def json(self) -> dict:
        """The payload as a JSON object; Malformed when it is not one."""
        try:
            value = json.loads(self.payload.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise Malformed(f"a {self.kind} frame that is not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise Malformed(f"a {self.kind} frame that is not a JSON object")
        return value


class Malformed(StreamClosed):
    """The follow stream carried something that is not a frame: ends it like a lost connection. Internal,
    as StreamClosed is: the follower reconnects, and after MAX_MALFORMED in a row reports the host lost."""


class FollowStream:
    """Frames from `follow`, parsed from large reads (a frame per log chunk, not per line)."""

    def __init__(self, stream: Stream, label: str):
        self._stream = stream
        self._label = label
        self._buf = bytearray()
        self._pos = 0  # frames are parsed from here; the consumed front is dropped only now and then

    def next(self, timeout: float) -> Frame:
        """The next frame; TimeoutError if none within timeout; StreamClosed at the end of the stream."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buf) - self._pos >= FRAME.size:
                kind, rank, offset, length = FRAME.unpack_from(self._buf, self._pos)
                if kind not in MAX_PAYLOAD or length > MAX_PAYLOAD[kind]:  # judged on the header alone
                    raise Malformed(f"garbled log stream from {self._label} (a login shell printing text?): "
                                    f"frame kind {kind!r}, {length} bytes")
                start = self._pos + FRAME.size
                if len(self._buf) >= start + length:
                    payload = bytes(self._buf[start:start + length])
                    self._pos = start + length
                    if self._pos > (1 << 20):
                        del self._buf[:self._pos]
                        self._pos = 0
                    return Frame(kind.decode(), rank, offset, payload)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            chunk = self._stream.read(1 << 18, left)
            if not chunk:
                code = exit_code_of(self._stream)
                if code == EXIT_PROGRAM_MISSING and len(self._buf) == self._pos:
                    raise ProgramMissing()
                tail = self._stream.stderr().decode("utf-8", "replace")
                raise StreamClosed(f"log stream ended (exit {code}){': ' + tail[-500:] if tail else ''}")
            self._buf += chunk

    def close(self) -> None:
        self._stream.close()


def exit_code_of(stream: Stream) -> Optional[int]:
    try:
        return stream.wait(2.0)
    except TimeoutError:
        return None


class Prepended(FollowStream):
    """A follow stream whose first frame was already read (to learn whether the host program exists)."""

    def __init__(self, inner: FollowStream, first: Frame):
        self.__dict__.update(inner.__dict__)
        self._first: Optional[Frame] = first

    def next(self, timeout: float) -> Frame:
        if self._first is not None:
            frame, self._first = self._first, None
            return frame
        return super().next(timeout)


class Samples:
    """The lines of a host's `samples`, one dict each; `first` is the one that came with the call."""

    def __init__(self, stream: Stream, label: str):
        self._stream = stream
        self._label = label
        self._buf = b""
        self.first: Optional[dict] = None

    def next(self, timeout: float) -> dict:
        """The next sample; CommandTimeout if none within timeout, ConnectError when the stream ends (or
        carries something that is not a sample): hosts/failures.py's words, as for every host call."""
        from .failures import exchange

        with exchange(self._label, silent=f"samples: nothing within {timeout:g} s", lost="samples ended"):
            return self._next(timeout)

    def _next(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            chunk = self._stream.read(1 << 16, left)
            if not chunk:
                if exit_code_of(self._stream) == EXIT_PROGRAM_MISSING:
                    raise ProgramMissing()
                tail = self._stream.stderr().decode("utf-8", "replace").strip()[-300:]
                raise StreamClosed(f"exit {exit_code_of(self._stream)}" + (f": {tail}" if tail else ""))
            self._buf += chunk
            if len(self._buf) > 1 << 22:
                raise StreamClosed("a sample line longer than 4 MiB")
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            value = json.loads(line.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise StreamClosed(f"a sample that is not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise StreamClosed("a sample that is not a JSON object")
        return value

    def close(self) -> None:
        self._stream.close()
