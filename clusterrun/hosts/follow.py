"""One thread per host that follows its ranks' logs and exits, and survives dropped connections.

It keeps the byte offset of every rank, so after a reconnect the host resends from there and nothing is
lost or shown twice; it keeps the controller's copy of each log; and it declares the host lost when
nothing at all (not even a heartbeat) came for `host_lost` seconds. A stream that carries garbage ends
like a lost connection; three garbled streams in a row make the host lost: the follower never hangs
and never dies without saying how it ended (FollowDone, HostLost, or RunGone: the host answered that it
has no such run, which no retry changes).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterable, Optional, Sequence

from ..errors import HostError
from ..events import HostRestarts, LogLines, RankSeen, Rendezvous, Stuck
from ..transport import StreamClosed
from .client import HostClient
from .logs import LineSplitter, LogCopy
from .wire import FollowStream, Frame, Malformed

IDLE_FLUSH_S = 1.0  # show an unfinished line (a progress bar without newline) after this long
MAX_MALFORMED = 3  # garbled streams in a row before the host counts as lost


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
class PeerLost:
    """Rank 0's host's supervisor lost another host of the run (its mesh: remote/host/run/peers.py): that
    host is gone as far as the run goes, before its own follower's silence says so (host_lost later)."""

    node_rank: int  # the host lost
    reason: str


@dataclass(frozen=True)
class RunGone(HostLost):
    """The host answered that it has no such run (its folder is gone, or the run never started there).
    Not an exception: one of the follower's ends, put on its queue like HostLost and FollowDone."""


@dataclass(frozen=True)
class FollowDone:
    node_rank: int


class _Refused(Exception):
    """The host's follow answered a failure (an F frame) instead of frames. Internal: the follower's own
    loop turns it into its end (RunGone or HostLost), which is what the monitor hears."""

    def __init__(self, answer: dict):
        super().__init__(str(answer.get("error") or "refused"))
        self.missing = answer.get("kind") == "missing"


@dataclass(frozen=True)
class LogFiles:
    """Where the controller keeps its copies: a rank's log, and a host's auxiliary streams by name."""

    rank: Callable[[int], str]
    aux: Callable[[str], str] = lambda name: ""


class Follower(threading.Thread):
    def __init__(self, *, node_rank: int, host: str, ranks: Iterable[int], files: LogFiles, world_size: int,
                 attempt_key: str, client: Callable[[bool], HostClient], out: "queue.Queue", host_lost_s: float,
                 offsets: Optional[Dict[Hashable, int]] = None, once: bool = False, aux: Sequence[str] = (),
                 first: Optional[FollowStream] = None):
        """ranks: the ranks expected on this host (under torchrun more may turn up: any below world_size).
        aux: names of the host's auxiliary streams, by index (("torchrun",) under torchrun). offsets:
        bytes already copied, by rank or ("a", index). client(reconnect) gives the host's client, a fresh
        connection when reconnect is true. first: a stream already flowing from offset 0 (the launch's start
        on the push's channel), followed before any `follow` command is asked for."""
        super().__init__(name=f"follow-{host}", daemon=True)
        self.node_rank = node_rank
        self.host = host
        self.attempt_key = attempt_key
        self._files = files
        self._world = world_size
        self._aux = tuple(aux)
        self._client = client
        self._out = out
        self._host_lost_s = host_lost_s
        self._once = once
        self._first = first
        self._copies: Dict[Hashable, LogCopy] = {}
        self._split: Dict[Hashable, LineSplitter] = {}
        self.offsets: Dict[Hashable, int] = dict(offsets or {})
        for rank in ranks:
            self._open(rank)
        for i in range(len(self._aux)):
            self._open(("a", i))
        self.clock_offset = 0.0
        self.restarts = 0
        self._told_lost: set = set()  # the peers rank 0's host said it lost (PeerLost), each told once
        self._halt = threading.Event()
        self._malformed = 0
        self.last_heard = time.monotonic()

    def stop(self) -> None:
        self._halt.set()

    def _open(self, key: Hashable) -> None:
        path = self._files.aux(self._aux[key[1]]) if isinstance(key, tuple) else self._files.rank(key)
        self._copies[key] = LogCopy(path)
        self._split[key] = LineSplitter()
        self.offsets.setdefault(key, 0)

    def run(self) -> None:
        try:
            ended = self._follow()
        except Exception as exc:  # never die silently: the monitor waits for FollowDone or HostLost
            ended = HostLost(self.node_rank, self.host, f"following its logs failed: {type(exc).__name__}: {exc}")
        finally:
            if self._first is not None:  # stopped before it was read
                self._first.close()
            for copy in self._copies.values():
                copy.close()
        if ended is not None:
            self._out.put(ended)

    def _follow(self):
        reconnect = False
        while not self._halt.is_set():
            try:
                stream, self._first = self._first or self._client(reconnect).follow(
                    self.attempt_key, self.offsets, once=self._once), None
            except (HostError, StreamClosed, OSError) as exc:
                if self._silent_too_long():
                    return HostLost(self.node_rank, self.host, f"no answer for {self._host_lost_s:g} s ({exc})")
                reconnect = True
                self._halt.wait(0.5)
                continue
            try:
                if self._pump(stream):
                    return FollowDone(self.node_rank)
                self._malformed = 0
            except _Refused as exc:  # a permanent answer: asking again changes nothing
                return (RunGone if exc.missing else HostLost)(self.node_rank, self.host, str(exc))
            except Malformed as exc:
                self._malformed += 1
                if self._malformed >= MAX_MALFORMED:
                    return HostLost(self.node_rank, self.host, f"its log stream is garbled: {exc}")
                reconnect = True
            except (StreamClosed, HostError, OSError):
                reconnect = True  # retried until silent for host_lost seconds
            finally:
                stream.close()
            if self._silent_too_long():
                return HostLost(self.node_rank, self.host, f"no answer for {self._host_lost_s:g} s")
        return None

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
            if self._handle(frame):
                return True
            self.last_heard = time.monotonic()
        return False

    def _handle(self, frame: Frame) -> bool:
        """One frame (checked before anything is done with it); True at the end of the stream."""
        self._check(frame)
        if frame.kind == "L":
            self._log(frame.rank, frame.offset, frame.payload)
        elif frame.kind == "A":
            self._log(("a", frame.rank), frame.offset, frame.payload)
        elif frame.kind == "X":
            self._rank_exit(frame)
        elif frame.kind == "H":
            self._heartbeat(frame.json())
        elif frame.kind == "E":
            for key in list(self._split):
                self._flush(key)
            return True
        elif frame.kind == "F":
            raise _Refused(frame.json())
        return False

    def _check(self, frame: Frame) -> None:
        """A frame for a rank or stream this host cannot have is garbage."""
        if frame.kind in ("L", "X") and frame.rank >= self._world:
            raise Malformed(f"a frame for rank {frame.rank}, but the world has {self._world} ranks")
        if frame.kind == "A" and frame.rank >= len(self._aux):
            raise Malformed(f"a frame for auxiliary stream {frame.rank}, unknown here")

    def _rank_exit(self, frame: Frame) -> None:
        info = frame.json()
        self._seen(frame.rank)
        self._flush(frame.rank)
        self._out.put(RankExit(self.node_rank, frame.rank, info, self.clock_offset))

    def _heartbeat(self, beat: dict) -> None:
        """The host's clock, torchrun's restarts so far, and the ranks stuck connecting to a peer."""
        if not isinstance(beat.get("now"), (int, float)):
            raise Malformed("a heartbeat without a time")
        self.clock_offset = beat["now"] - time.time()
        restarts = beat.get("restarts") or 0
        if isinstance(restarts, int) and restarts > self.restarts:
            self.restarts = restarts
            self._out.put(HostRestarts(self.node_rank, self.host, restarts))
        lost = beat.get("lost")
        for node, why in (lost.items() if isinstance(lost, dict) else ()):
            if str(node).isdigit() and int(node) not in self._told_lost and isinstance(why, str):
                self._told_lost.add(int(node))
                self._out.put(PeerLost(int(node), why[:300]))
        for c in beat.get("connecting") or ():
            if isinstance(c, dict) and isinstance(c.get("remote"), str):
                self._out.put(Stuck(self.node_rank, self.host, c.get("rank"), c["remote"],
                                    float(c.get("seconds") or 0)))
        self._rendezvous(beat.get("rendezvous"))

    def _rendezvous(self, findings: object) -> None:
        """The host's rendezvous watchdog's findings (every beat carries them all: the key says each once)."""
        for f in findings if isinstance(findings, list) else ():
            if isinstance(f, dict) and isinstance(f.get("text"), str) and isinstance(f.get("kind"), str):
                rank = f.get("rank") if isinstance(f.get("rank"), int) else None
                seconds, held = (float(f[k]) if isinstance(f.get(k), (int, float)) else 0.0 for k in ("seconds", "held"))
                self._out.put(Rendezvous(self.node_rank, self.host, f["kind"][:40], rank, f["text"][:1000], seconds,
                                         held))

    def _seen(self, rank: int) -> None:
        if rank not in self._copies:  # torchrun's rendezvous put this rank here
            self._open(rank)
            self._out.put(RankSeen(self.node_rank, rank))

    def _emit(self, key: Hashable, data: bytes) -> None:
        if isinstance(key, tuple):
            self._out.put(LogLines(self.host, self.node_rank, -1, data, stream=self._aux[key[1]]))
        else:
            self._out.put(LogLines(self.host, self.node_rank, key, data))

    def _flush(self, key: Hashable) -> None:
        rest = self._split[key].flush()
        if rest:
            self._emit(key, rest)

    def _log(self, key: Hashable, offset: int, data: bytes) -> None:
        if not isinstance(key, tuple):
            self._seen(key)
        have = self.offsets.get(key, 0)
        if offset + len(data) <= have:
            return  # resent after a reconnect: already have it
        if offset > have:
            raise Malformed(f"log bytes at offset {offset} of {key}, but only {have} arrived before")
        data, offset = data[have - offset:], have
        self._copies[key].write_at(offset, data)
        self.offsets[key] = offset + len(data)
        lines = self._split[key].feed(data)
        if lines:
            self._emit(key, lines)

    def _flush_idle(self) -> None:
        now = time.monotonic()
        for key, splitter in self._split.items():
            if splitter.partial_since is not None and now - splitter.partial_since > IDLE_FLUSH_S:
                self._emit(key, splitter.flush())
