"""The controller's side of the host's `pull` (remote/host/observe/pull.py, protocol at its top): the
listing of what the PATHs select, then the bytes of the files asked for, each handed to a sink as it
comes. What to ask for and where the bytes go is the caller's (runs/pull.py)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Sequence, Tuple

from ..errors import ConnectError, OutsideRun
from ..transport import Stream, StreamClosed
from .failures import error_answer, exchange
from .wire import MSG_LEN, pack_msg

CHUNK_LEN = struct.Struct(">I")
MAX_CHUNK = 4 << 20  # the host sends at most 1 MiB per chunk: a bigger length is garbage, not data
LOST = "connection lost during the pull"


@dataclass(frozen=True)
class RemoteFile:
    rel: str  # its place under the pull's folder: relative to the job folder, or checkpoints/...
    size: int
    mode: int
    sha256: Optional[str]  # where the host remembers it (else it is worked out as the file is sent)


@dataclass(frozen=True)
class Listing:
    files: Tuple[RemoteFile, ...]
    unmatched: Tuple[str, ...]  # PATHs that selected nothing
    skipped: Tuple[Tuple[str, str], ...]  # (path, why): symlinks out of the run, folders behind symlinks

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Want:
    """A file to fetch from an offset (prefix_sha256: the SHA-256 of the bytes held here before it), unless
    the whole file held here (its SHA-256: have) is the host's."""

    rel: str
    offset: int = 0
    prefix_sha256: Optional[str] = None
    have: Optional[str] = None


class Sink(Protocol):
    """Where one file's bytes go as they come."""

    def same(self) -> None:
        """The file held here is the host's (the want's `have`): nothing comes."""

    def begin(self, offset: int) -> None:
        """The host sends from this offset (0 when the bytes held here were not a prefix of the file)."""

    def write(self, data: memoryview) -> None: ...

    def end(self, sha256: str, size: int) -> None:
        """The whole file as it is here now should have this SHA-256 and size."""


class _Reader:
    """A stream's bytes, read in large pieces and handed out as views of them, never copied or joined.

    Each read asks for more than the SSH channel's window can hold: paramiko then hands over its buffer
    whole, where a smaller read slices it and shifts the rest down (for a 1 MiB read of an 8 MiB buffer,
    8 MiB moved per MiB read: most of a pull's CPU before)."""

    READ = 32 << 20

    def __init__(self, stream: Stream, timeout: float):
        self._stream = stream
        self._timeout = timeout
        self._data = b""
        self._pos = 0

    def parts(self, n: int, timeout: Optional[float] = None) -> List[memoryview]:
        """The next n bytes, as views of what was read (several when they span two reads)."""
        out: List[memoryview] = []
        while n:
            if self._pos >= len(self._data):
                self._data, self._pos = self._stream.read(self.READ, timeout or self._timeout), 0
                if not self._data:
                    raise StreamClosed("end of output")
            k = min(n, len(self._data) - self._pos)
            out.append(memoryview(self._data)[self._pos:self._pos + k])
            self._pos += k
            n -= k
        return out

    def exact(self, n: int, timeout: Optional[float] = None) -> bytes:
        return b"".join(self.parts(n, timeout))


class PullStream:
    """One `pull` command on one host: its listing, then the fetch of what is wanted (once)."""

    def __init__(self, stream: Stream, label: str, timeout: float):
        self._stream = stream
        self._label = label
        self._timeout = timeout
        self._reader = _Reader(stream, timeout)
        self.listing: Optional[Listing] = None

    def request(self, paths: Sequence[str], list_timeout: float) -> Listing:
        """The PATHs out, the listing back (list_timeout: the host hashes what it has not hashed before)."""
        with exchange(self._label, silent=f"pull: no answer within {self._timeout:g} s", lost="pull"):
            self._stream.write(pack_msg({"paths": list(paths)}), self._timeout)
        answer = self._read(list_timeout)
        if "error" in answer:
            self._raise(answer)
        self.listing = Listing(tuple(RemoteFile(rel, int(size), int(mode), sha) for rel, size, mode, sha in
                                     answer["files"]),
                               tuple(answer.get("unmatched") or ()), tuple(tuple(s) for s in answer.get("skipped") or ()))
        return self.listing

    def fetch(self, wants: Sequence[Want], sink_for: Callable[[RemoteFile], Sink]) -> int:
        """Ask for these files and hand each one's bytes to its sink; the bytes received."""
        by_rel = {f.rel: f for f in (self.listing.files if self.listing else ())}
        with exchange(self._label, silent=f"pull: no answer within {self._timeout:g} s", lost=LOST):
            self._stream.write(pack_msg({"want": [[w.rel, w.offset, w.prefix_sha256, w.have] for w in wants]}),
                               self._timeout)
        received = 0
        for _ in wants:
            head = self._read()
            if "error" in head:
                self._raise(head)
            sink = sink_for(by_rel[head["file"]])
            if head.get("same"):
                sink.same()
                continue
            sink.begin(int(head["offset"]))
            received += self._chunks(sink)
            tail = self._read()
            sink.end(tail["sha256"], int(tail["size"]))
        done = self._read()
        if "error" in done:
            self._raise(done)
        return received

    def _chunks(self, sink: Sink) -> int:
        got = 0
        while True:
            (n,) = CHUNK_LEN.unpack(self._bytes(CHUNK_LEN.size))
            if n == 0:
                return got
            if n > MAX_CHUNK:
                raise ConnectError(self._label, f"pull: garbled stream (a chunk of {n} bytes)")
            for part in self._parts(n):
                sink.write(part)
            got += n

    def _parts(self, n: int) -> List[memoryview]:
        with exchange(self._label, silent=f"pull: no data within {self._timeout:g} s", lost=LOST):
            return self._reader.parts(n)

    def _bytes(self, n: int) -> bytes:
        return b"".join(self._parts(n))

    def _read(self, timeout: Optional[float] = None) -> dict:
        timeout = timeout or self._timeout
        with exchange(self._label, silent=f"pull: no answer within {timeout:g} s", lost=LOST, stream=self._stream):
            (n,) = MSG_LEN.unpack(self._reader.exact(MSG_LEN.size, timeout))
            return json.loads(self._reader.exact(n, timeout).decode())

    def _raise(self, answer: dict) -> None:
        if answer.get("kind") == "outside":
            raise OutsideRun(self._label, answer["error"])
        raise error_answer(self._label, answer["error"], what="pull", path=answer.get("path") or "")

    def close(self) -> None:
        self._stream.close()
