"""Rank logs on the controller side: byte-offset copies, line splitting with bounded memory, tails."""

from __future__ import annotations

import os
import time
from typing import List, Optional

MAX_LINE = 64 * 1024  # a longer unfinished line is shown in pieces; the log files keep it whole


class LineSplitter:
    """Bytes in, whole lines out (each ending in a newline); holds at most MAX_LINE bytes of a partial line."""

    def __init__(self, max_line: int = MAX_LINE):
        self.max_line = max_line
        self._partial = b""
        self.partial_since: Optional[float] = None

    def feed(self, data: bytes) -> bytes:
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        lines, rest = data[:cut], data[cut:]
        if len(rest) >= self.max_line:  # a line without end (binary, a progress bar): show it in pieces
            lines, rest = lines + rest + b"\n", b""
        self._partial = rest
        # since when this unfinished line has waited for its end: a line that ended here starts the clock anew
        # (a flood ends nearly every chunk mid-line: the idle flush must not cut those lines in two)
        if not rest:
            self.partial_since = None
        elif cut or self.partial_since is None:
            self.partial_since = time.monotonic()
        return lines

    def flush(self) -> bytes:
        """The partial line, ended, if any (at a rank's exit, or after it sat idle)."""
        rest, self._partial, self.partial_since = self._partial, b"", None
        return rest + b"\n" if rest else b""


class LogCopy:
    """The controller's copy of one rank's log, written at the host's byte offsets (so a replay after a
    reconnect overwrites the same bytes rather than appending them twice)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def write_at(self, offset: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def close(self) -> None:
        os.close(self._fd)


def tail_lines(path: str, n: int, max_bytes: int = 1 << 20) -> List[str]:
    """The last n lines of a file, decoded with replacement (for messages, never for the log itself)."""
    if n <= 0:
        return []
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-n:]
