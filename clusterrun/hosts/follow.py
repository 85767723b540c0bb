"""One thread per host that follows its ranks' logs and exits, and survives dropped connections.

It keeps the byte offset of every rank, so after a reconnect the host resends from there and nothing is
lost or shown twice; it keeps the controller's copy of each log; and it declares the host lost when
nothing at all (not even a heartbeat) came for `host_lost` seconds.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from ..errors import HostError
from ..events import LogLines
from ..transport import StreamClosed
from .client import HostClient
from .logs import LineSplitter, LogCopy
from .wire import FollowStream

IDLE_FLUSH_S = 1.0  # show an unfinished line (a progress bar without newline) after this long


@dataclass(frozen=True)
class RankExit:
    node_rank: int
    rank: int
    info: dict  # the host's exit record
    clock_offset: float  # host clock minus controller clock, from the last heartbeat


@dataclass(frozen=True)
class HostLost:
    node_rank: int
    host: str
    reason: str


@dataclass(frozen=True)
class FollowDone:
    node_rank: int


class Follower(threading.Thread):
    def __init__(self, *, node_rank: int, host: str, ranks: Dict[int, str], run_id: str,
                 client: Callable[[bool], HostClient], out: "queue.Queue", host_lost_s: float,
                 offsets: Optional[Dict[int, int]] = None, once: bool = False):
        """ranks: rank → path of its local log copy. client(reconnect) gives the host's client, a fresh
        connection when reconnect is true."""
        super().__init__(name=f"follow-{host}", daemon=True)
        self.node_rank = node_rank
        self.host = host
        self.run_id = run_id
        self._client = client
        self._out = out
        self._host_lost_s = host_lost_s
        self._once = once
        self._copies = {rank: LogCopy(path) for rank, path in ranks.items()}
        self.offsets = dict(offsets) if offsets else {rank: 0 for rank in ranks}
        self._split = {rank: LineSplitter() for rank in ranks}
        self.clock_offset = 0.0
        self._halt = threading.Event()
        self.last_heard = time.monotonic()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        reconnect = False
        try:
            while not self._halt.is_set():
                try:
                    stream = self._client(reconnect).follow(self.run_id, self.offsets, once=self._once)
                except (HostError, StreamClosed, OSError) as exc:
                    if self._silent_too_long():
                        self._out.put(HostLost(self.node_rank, self.host, f"no answer for {self._host_lost_s:g} s "
                                                                          f"({exc})"))
                        return
                    reconnect = True
                    self._halt.wait(0.5)
                    continue
                try:
                    if self._pump(stream):
                        self._out.put(FollowDone(self.node_rank))
                        return
                except (StreamClosed, HostError, OSError):
                    reconnect = True  # retried until silent for host_lost seconds
                finally:
                    stream.close()
                if self._silent_too_long():
                    self._out.put(HostLost(self.node_rank, self.host, f"no answer for {self._host_lost_s:g} s"))
                    return
        finally:
            for copy in self._copies.values():
                copy.close()

    def _silent_too_long(self) -> bool:
        return time.monotonic() - self.last_heard > self._host_lost_s

    def _pump(self, stream: FollowStream) -> bool:
        """Handle frames until the end (True), a stop request (False), or silence (StreamClosed)."""
        while not self._halt.is_set():
            try:
                frame = stream.next(0.25)
            except TimeoutError:
                self._flush_idle()
                if self._silent_too_long():
                    raise StreamClosed(f"silent for {self._host_lost_s:g} s") from None
                continue
            self.last_heard = time.monotonic()
            if frame.kind == "L":
                self._log(frame.rank, frame.offset, frame.payload)
            elif frame.kind == "X":
                rest = self._split[frame.rank].flush()
                if rest:
                    self._out.put(LogLines(self.host, self.node_rank, frame.rank, rest))
                self._out.put(RankExit(self.node_rank, frame.rank, frame.json(), self.clock_offset))
            elif frame.kind == "H":
                self.clock_offset = frame.json()["now"] - time.time()
            elif frame.kind == "E":
                for rank, splitter in self._split.items():
                    rest = splitter.flush()
                    if rest:
                        self._out.put(LogLines(self.host, self.node_rank, rank, rest))
                return True
        return False

    def _log(self, rank: int, offset: int, data: bytes) -> None:
        have = self.offsets.get(rank, 0)
        if offset + len(data) <= have:
            return  # resent after a reconnect: already have it
        if offset < have:
            data, offset = data[have - offset:], have
        self._copies[rank].write_at(offset, data)
        self.offsets[rank] = offset + len(data)
        lines = self._split[rank].feed(data)
        if lines:
            self._out.put(LogLines(self.host, self.node_rank, rank, lines))

    def _flush_idle(self) -> None:
        now = time.monotonic()
        for rank, splitter in self._split.items():
            if splitter.partial_since is not None and now - splitter.partial_since > IDLE_FLUSH_S:
                self._out.put(LogLines(self.host, self.node_rank, rank, splitter.flush()))
