"""Waiting on one file descriptor with poll(), not select(): select refuses any descriptor past 1023
(FD_SETSIZE), and a launch on 128 hosts holds more open files than that (hosts/fds.py raises the limit)."""

from __future__ import annotations

import select
from typing import Optional


def ready(fd: int, timeout: Optional[float], write: bool = False) -> bool:
    """Whether fd is readable (or writable) within timeout seconds (None: wait as long as it takes)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999))))
