"""The terminal's two streams: rank logs on stdout as `[node r3] line` (bytes, never parsed as markup:
training logs are full of `[...]`), everything else on stderr through a rich console. NO_COLOR is
honoured; off a terminal, tables are not cut at 80 columns.
"""

from __future__ import annotations

import os
import sys
from typing import BinaryIO, Dict, Iterable, List, Optional, Sequence

from rich.console import Console
from rich.style import Style

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green")


def console(stderr: bool = True, **kw) -> Console:
    """A rich console; when not a terminal, wide enough that tables and messages are not cut at 80."""
    probe = sys.stderr if stderr else sys.stdout
    width = None if probe.isatty() else max(160, int(os.environ.get("COLUMNS", "0") or 0))
    return Console(stderr=stderr, width=width, highlight=False, soft_wrap=True,
                   no_color=bool(os.environ.get("NO_COLOR")), **kw)


def color_wanted(stream) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return hasattr(stream, "isatty") and stream.isatty()


MASK = b"***"
MIN_MASKED = 4  # shorter values would garble ordinary output ("1" everywhere); such secrets are not secret


def maskable(secrets: Iterable[str]) -> List[bytes]:
    return sorted((v.encode() for v in secrets if len(v) >= MIN_MASKED), key=len, reverse=True)


def mask_text(text: str, secrets: Sequence[bytes]) -> str:
    for value in secrets:
        text = text.replace(value.decode(), MASK.decode())
    return text


class LogPrinter:
    """Prefixes each line with `[host rR] ` (coloured per host) and writes bytes to stdout.

    Secret values are masked in what is shown, even when a rank prints one (the log files on the host
    and the local copies keep the exact bytes, readable by their owner only)."""

    def __init__(self, out: Optional[BinaryIO] = None, color: Optional[bool] = None,
                 secrets: Iterable[str] = ()):
        self.out = out or sys.stdout.buffer
        self.color = color_wanted(sys.stdout) if color is None else color
        self.secrets = maskable(secrets)
        self._prefix: Dict[tuple, bytes] = {}
        self._host_color: Dict[str, str] = {}

    def prefix(self, host: str, rank: Optional[int], stream: str = "") -> bytes:
        """`[host rR]` for a rank, `[host stream]` for a host's other output, `[host]` for neither."""
        key = (host, rank, stream)
        if key not in self._prefix:
            text = f"[{host} {stream}]" if stream else (f"[{host}]" if rank is None else f"[{host} r{rank}]")
            if self.color:
                color = self._host_color.setdefault(host, PALETTE[len(self._host_color) % len(PALETTE)])
                text = Style(color=color).render(text)
            self._prefix[key] = text.encode() + b" "
        return self._prefix[key]

    def write(self, host: str, rank: Optional[int], data: bytes, stream: str = "") -> None:
        if not data:
            return
        for value in self.secrets:
            if value in data:
                data = data.replace(value, MASK)
        prefix = self.prefix(host, rank, stream)
        body = data[:-1] if data.endswith(b"\n") else data
        # one C-level replace per batch rather than a Python step per line (a flood is ~1M lines/s)
        self.out.write(prefix + body.replace(b"\n", b"\n" + prefix) + b"\n")
        self.out.flush()
