"""Pacing of SSH connections to one sshd: how many of this process's connections may be between TCP connect
and authentication at once (transport/ssh.py takes a Gate for each hop and host it connects to)."""

from __future__ import annotations

import threading
from typing import Dict, Tuple


class Gate:
    """How many connections to one sshd may be between TCP connect and authentication at once. sshd's
    MaxStartups counts exactly those (OpenSSH's default 10:30:100 starts turning some away at 10): a
    launch to 64 hosts behind one jump host would otherwise open 64 at once there. A connection turned
    away (Dropped) lowers the limit to fewer than were in flight then, and is tried again."""

    LIMIT = 8  # under OpenSSH's default MaxStartups start (10), with room for someone else's ssh

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self.active = 0
        self._cond = threading.Condition()

    def __enter__(self) -> "Gate":
        with self._cond:
            while self.active >= self.limit:
                self._cond.wait()
            self.active += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self.active -= 1
            self._cond.notify_all()

    def dropped(self) -> None:
        with self._cond:
            self.limit = max(1, min(self.limit, self.active) - 1)


_gates: Dict[Tuple[str, int], Gate] = {}
_gates_lock = threading.Lock()


def gate(hostname: str, port: int) -> Gate:
    """The one Gate of this process for an sshd (by the name and port it is reached at)."""
    with _gates_lock:
        return _gates.setdefault((hostname, port), Gate())
