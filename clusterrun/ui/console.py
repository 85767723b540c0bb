"""The terminal's two streams: rank logs on stdout as `[node r3] line` (bytes, never parsed as markup:
training logs are full of `[...]`), everything else on stderr through a rich console. NO_COLOR is
honoured; off a terminal, tables are not cut at 80 columns.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, BinaryIO, Callable, Dict, Iterable, List, Optional, Sequence

from rich.console import Console
from rich.style import Style

if TYPE_CHECKING:
    from .fold import Folded, Folder, Source

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
        if data:
            self._write(self.prefix(host, rank, stream), data)

    def write_folded(self, folded: Iterable["Folded"], world: Optional[int] = None) -> None:
        """What a fold.Folder released, in one write: lines several sources printed alike under their set
        (`[node[0-7] r*]`), a source's own as write shows them. (A write and a flush per line held a flood of
        16 ranks' distinct lines to ~45k lines/s.)"""
        out = b"".join(self._render(self._folded_prefix(f.sources, world), f.data) for f in folded)
        if out:
            self.out.write(out)
            self.out.flush()

    def _folded_prefix(self, sources: Sequence["Source"], world: Optional[int]) -> bytes:
        if len(sources) == 1:
            return self.prefix(*sources[0])
        from .fold import group_label

        text = f"[{group_label(sources, world)}]"
        hosts = {s[0] for s in sources}
        if self.color:
            color = self._host_color.setdefault(next(iter(hosts)), PALETTE[len(self._host_color) % len(PALETTE)]) \
                if len(hosts) == 1 else None
            text = Style(color=color, bold=True).render(text)
        return text.encode() + b" "

    def tick(self) -> None:
        """Nothing held here (FoldingPrinter holds lines)."""

    def flush(self) -> None:
        """Nothing held here (FoldingPrinter holds lines)."""

    def _write(self, prefix: bytes, data: bytes) -> None:
        self.out.write(self._render(prefix, data))
        self.out.flush()

    def _render(self, prefix: bytes, data: bytes) -> bytes:
        for value in self.secrets:
            if value in data:
                data = data.replace(value, MASK)
        body = data[:-1] if data.endswith(b"\n") else data
        # one C-level replace per batch rather than a Python step per line (a flood is ~1M lines/s)
        return prefix + body.replace(b"\n", b"\n" + prefix) + b"\n"


class FoldingPrinter:
    """A LogPrinter behind a fold.Folder: the same line from many ranks within the window shown once,
    with their set. Lines of `setup` (before the run's loop, which calls tick) are shown as they come,
    unless hold_setup (a replay, whose clock is the line number)."""

    def __init__(self, printer: LogPrinter, world: Optional[int] = None, folder: Optional["Folder"] = None,
                 clock: Optional[Callable[[], float]] = None, hold_setup: bool = False):
        import time

        from .fold import Folder

        self.printer = printer
        self.world = world
        self.folder = folder or Folder()
        self.clock = clock or time.monotonic
        self.hold_setup = hold_setup

    @property
    def secrets(self) -> List[bytes]:
        return self.printer.secrets

    def write(self, host: str, rank: Optional[int], data: bytes, stream: str = "") -> None:
        if not data:
            return
        if stream == "setup" and not self.hold_setup:
            self.printer.write(host, rank, data, stream)
            return
        source = (host, None if rank is None or rank < 0 else rank, stream)
        self._show(self.folder.add(source, data, self.clock()))

    def tick(self) -> None:
        """Show what has waited its window."""
        if self.folder.held:
            self._show(self.folder.due(self.clock()))

    def flush(self) -> None:
        """Show everything held."""
        self._show(self.folder.flush())

    def _show(self, folded) -> None:
        if folded:
            self.printer.write_folded(folded, self.world)


def log_printer(secrets: Iterable[str] = (), fold: bool = False, world: Optional[int] = None):
    """A LogPrinter, behind a FoldingPrinter when fold."""
    printer = LogPrinter(secrets=secrets)
    return FoldingPrinter(printer, world) if fold else printer
