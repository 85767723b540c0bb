"""Relay push, the controller's part: the hosts of one push form a chain (node order), the controller sends
each object once, to the chain's first host, and every host passes on what the hosts after it still need
(remote/host/push/relay.py). Hosts that cannot take part get the direct push they would have had anyway.

Every host's push thread (hosts/client.py) answers the manifest, then meets the others here: once every
host has said what its cache lacks (or given up, or the wait ran out), the chain is laid out and each
thread gets its host's instructions. Host j's stream is every object that hosts j, j+1, … lack, in
manifest order: a host passes on bytes it already had, and keeps what it lacked.

When it pays (`push: {relay: auto}`): with at least RELAY_MIN_HOSTS hosts and at least RELAY_MIN_BYTES
for the hosts to receive together; below that the direct path costs no more (bench/sections/relay.py).
The bytes are judged twice: the manifest times the hosts decides whether the chain is set up at all
(`pays`), what the hosts say they lack, together, whether it is used (`_lay_out`).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

RELAY_MIN_HOSTS = 3
RELAY_MIN_BYTES = 16 << 20

Obj = Tuple[str, int, bool]  # sha256, size, executable


def relay_wanted(mode: str, hosts: int, job_bytes: Optional[int] = None) -> bool:
    """Should a push of job_bytes (for all hosts together; None: not known yet) to this many hosts go
    through the relay? mode: auto|true|false."""
    if mode == "false" or hosts < 2:
        return False
    return mode == "true" or (hosts >= RELAY_MIN_HOSTS and (job_bytes is None or job_bytes >= RELAY_MIN_BYTES))


def for_push(mode: str, hosts: int, timeouts) -> "Optional[RelayGroup]":
    """The chain for a push to this many hosts, or None for direct pushes. Under auto the bytes decide
    when the chain is laid out (the hosts have said what they lack by then)."""
    if not relay_wanted(mode, hosts):
        return None
    return RelayGroup(hosts, wait=timeouts.command, connect_wait=timeouts.connect, silence=timeouts.command,
                      min_bytes=0 if mode == "true" else RELAY_MIN_BYTES)


@dataclass
class _Seat:
    missing: List[Obj]
    addr: str
    port: Optional[int]
    name: str


@dataclass
class RelayGroup:
    """One push's chain. `arrive` blocks until every expected host arrived or gave up (or `wait` ran out)."""

    expected: int
    order: Dict[str, int] = field(default_factory=dict)  # manifest order of each object, by sha
    wait: float = 30.0  # how long the first host waits for the others at the barrier
    connect_wait: float = 10.0  # how long a host waits for its upstream to connect (and connects downstream)
    silence: float = 60.0  # how long a host waits for the next byte from its upstream
    min_bytes: int = 0  # below this much to send to every host together, everyone goes direct
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    _seats: Dict[int, _Seat] = field(default_factory=dict)
    _gone: set = field(default_factory=set)
    _chain: Optional[List[int]] = None
    _pays: Optional[bool] = None
    laid_out_at: Optional[float] = None  # when the last host arrived and the chain was laid out (time.time())
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def pays(self, manifest) -> bool:
        """Whether this push goes through the chain at all, decided once from the manifest (the same for
        every host): under auto, a job smaller than min_bytes / hosts can never reach the threshold, and
        its hosts skip the barrier and the extra round trip. Sets the objects' order for the chain."""
        with self._cond:
            if self._pays is None:
                self.order = manifest.object_order()
                self._pays = manifest.total_bytes * self.expected >= self.min_bytes
            return self._pays

    def fail(self, index: int) -> None:
        """This host will not arrive (connect or push failed before it could say what it lacks)."""
        with self._cond:
            self._gone.add(index)
            self._cond.notify_all()

    def arrive(self, index: int, name: str, missing: List[Obj], addr: str, port: Optional[int]) -> dict:
        """This host's instructions: where its objects come from, and what it passes on to whom."""
        deadline = time.monotonic() + self.wait
        with self._cond:
            self._seats[index] = _Seat([(m[0], int(m[1]), bool(m[2])) for m in missing], addr, port, name)
            self._cond.notify_all()
            while self._chain is None and len(self._seats) + len(self._gone) < self.expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._chain is None:
                self._chain = self._lay_out()
                self.laid_out_at = time.time()
            chain = self._chain
        if index not in chain:  # came after the chain was laid out: a direct push of its own
            return {"from": "controller", "objects": [list(o) for o in self._seats[index].missing],
                    "downstream": None, "token": self.token, "node": 0, "wait": self.connect_wait,
                    "timeout": self.silence}
        return self._instructions(chain, chain.index(index))

    def _lay_out(self) -> List[int]:
        chain = sorted(i for i, s in self._seats.items() if s.port)
        total = sum(sum(o[1] for o in s.missing) for s in self._seats.values())
        return chain if len(chain) >= 2 and total >= self.min_bytes else []

    def _stream(self, seats: List[int]) -> List[Obj]:
        """Every object these hosts lack, once each, in manifest order."""
        union: Dict[Tuple[str, bool], Obj] = {}
        for i in seats:
            for o in self._seats[i].missing:
                union.setdefault((o[0], o[2]), o)
        return sorted(union.values(), key=lambda o: (self.order.get(o[0], 0), o[0], o[2]))

    def _instructions(self, chain: List[int], j: int) -> dict:
        out = {"from": "controller" if j == 0 else "peer", "objects": [list(o) for o in self._stream(chain[j:])],
               "downstream": None, "token": self.token, "node": j, "wait": self.connect_wait,
               "timeout": self.silence, "upstream_addr": self._seats[chain[j - 1]].addr if j else None,
               "laid_out": self.laid_out_at}
        if j + 1 < len(chain):
            nxt = self._seats[chain[j + 1]]
            out["downstream"] = {"addr": nxt.addr, "port": nxt.port, "node": j + 1, "name": nxt.name,
                                 "objects": [list(o) for o in self._stream(chain[j + 1:])]}
        return out
