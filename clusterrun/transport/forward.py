"""Ports here that reach localhost:PORT on a host, as `ssh -L LOCAL:localhost:PORT` does (TensorBoard and
Jupyter listen on localhost by default): through the connection clusterrun makes anyway (its ssh config,
jumps and host keys), one tunnel (a direct-tcpip channel: `Transport.tunnel`) per accepted connection.
The host program takes no part: this is a pump between sockets here and tunnels.

One thread does it all: a poll loop (selectors: select() fails past fd 1023) over the listening sockets,
the accepted connections and their tunnels (a paramiko channel has a fileno), with a bounded buffer per
direction; a side that is not read from while its buffer is full pushes back on its sender (the SSH
window, or TCP), never on memory.

Who may connect: as with `ssh -L`, every program of every user of this machine can reach 127.0.0.1:LOCAL
(there is no telling them apart). What one of them can do is bounded: at most MAX_CONNECTIONS forwarded at
once (more wait in the listen backlog until one ends), and running out of file descriptors (EMFILE) only
delays new connections (noted once) while the ones forwarded go on.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import HostError, UsageError
from . import Tunnel

BIND = "127.0.0.1"  # only this machine's own programs reach a forwarded port
BUFFER = 1 << 20  # per direction of a connection
READ = 1 << 16
IDLE_S = 0.2  # how often the loop looks at its stop condition when nothing happens
WAIT_WINDOW_S = 0.01  # bytes wait for the channel's window to open: look again this soon
MAX_CONNECTIONS = 64  # forwarded at once, over all ports; more wait in the backlog
FULL_BACKOFF_S = 0.5  # out of file descriptors: accept nothing for this long
_Selector = getattr(selectors, "PollSelector", selectors.DefaultSelector)


@dataclass(frozen=True)
class PortSpec:
    remote: int  # localhost:remote on the host
    local: int  # 127.0.0.1:local here (0: a free one)


class Forwarder:
    """Listening sockets here, each forwarding its connections to one port on the host; `serve` runs the
    loop until stop() says so, then closes every socket and tunnel."""

    def __init__(self, tunnel: Callable[[int], Tunnel], specs: Sequence[PortSpec],
                 on_note: Callable[[str], None] = lambda text: None,
                 on_taken: Optional[Callable[[PortSpec, str], None]] = None):
        """Binds every port now; a port taken here raises UsageError naming it (or, with on_taken, is
        passed over and reported there)."""
        self._tunnel = tunnel
        self._note = on_note
        self._noted: set = set()
        self.listeners: Dict[socket.socket, PortSpec] = {}
        self.pairs: List[_Pair] = []
        self._resume_at = 0.0  # out of file descriptors: no accept before this (monotonic)
        try:
            for spec in specs:
                self._listen(spec, on_taken)
        except BaseException:
            self.close()
            raise

    def _listen(self, spec: PortSpec, on_taken: Optional[Callable[[PortSpec, str], None]]) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; a listened one not
        try:
            sock.bind((BIND, spec.local))
        except OSError as exc:
            sock.close()
            taken = exc.errno == errno.EADDRINUSE
            why = f"{BIND}:{spec.local} is already taken here" if taken else f"cannot listen on {BIND}:{spec.local}: " \
                                                                            f"{exc.strerror or exc}"
            if on_taken is not None:
                on_taken(spec, why)
                return
            raise UsageError(f"{why} (another forward, or a local TensorBoard?); forward to another port: "
                             f"{spec.remote}:OTHER, or {spec.remote}:0 for a free one") from None
        sock.listen(16)
        sock.setblocking(False)
        self.listeners[sock] = PortSpec(spec.remote, sock.getsockname()[1])

    @property
    def bound(self) -> List[PortSpec]:
        """(remote, local) of every port that listens here, with the local port picked for LOCAL 0."""
        return list(self.listeners.values())

    def serve(self, stop: Callable[[], bool]) -> None:
        try:
            while not stop() and self.listeners:
                self.step()
        finally:
            self.close()

    def accepting(self) -> bool:
        return len(self.pairs) < MAX_CONNECTIONS and time.monotonic() >= self._resume_at

    def step(self) -> None:
        """One round: wait for something to do (at most IDLE_S), then do it."""
        readers: list = list(self.listeners) if self.accepting() else []
        writers: list = []
        for pair in self.pairs:
            readers += pair.readers()
            writers += pair.writers()
        waiting = any(pair.up and not pair.tunnel_full for pair in self.pairs)
        pause = time.monotonic() < self._resume_at
        ready_r, ready_w = wait_ready(readers, writers, WAIT_WINDOW_S if waiting or pause else IDLE_S)
        for obj in ready_r:
            if obj in self.listeners:
                self._accept(obj)
        for pair in list(self.pairs):
            pair.on_ready(ready_r, ready_w)
            if pair.done:
                pair.close()
                self.pairs.remove(pair)

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            self._out_of_files(exc)
            return
        remote = self.listeners[listener].remote
        try:
            tunnel = self._tunnel(remote)
        except HostError as exc:
            conn.close()  # the client sees the connection close, as with ssh -L
            self._once(str(exc), exc.message)
            return
        except OSError as exc:  # a channel's fileno is a pipe: it may be the descriptor that is missing
            conn.close()
            self._out_of_files(exc)
            return
        conn.setblocking(False)
        self.pairs.append(_Pair(conn, tunnel))

    def _out_of_files(self, exc: OSError) -> None:
        self._resume_at = time.monotonic() + FULL_BACKOFF_S
        self._once(f"forward: cannot take a new connection here ({exc.strerror or exc}: too many open "
                   f"files?); the {len(self.pairs)} forwarded go on, new ones wait", "files")

    def _once(self, text: str, key: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self._note(text)

    def close(self) -> None:
        for pair in self.pairs:
            pair.close()
        self.pairs = []
        for sock in self.listeners:
            sock.close()
        self.listeners = {}


def wait_ready(readers: Sequence[object], writers: Sequence[object], timeout: float) -> tuple:
    """(readable, writable) of these objects (each with a fileno) within timeout: select()'s answer,
    by poll, which knows no limit on descriptor numbers."""
    events: Dict[object, int] = {}
    for obj in readers:
        events[obj] = events.get(obj, 0) | selectors.EVENT_READ
    for obj in writers:
        events[obj] = events.get(obj, 0) | selectors.EVENT_WRITE
    if not events:
        time.sleep(timeout)
        return [], []
    with _Selector() as sel:
        for obj, mask in events.items():
            sel.register(obj, mask)
        ready = sel.select(timeout)
    return ([key.fileobj for key, mask in ready if mask & selectors.EVENT_READ],
            [key.fileobj for key, mask in ready if mask & selectors.EVENT_WRITE])


class _Pair:
    """One forwarded connection: the socket here and its tunnel, a buffer each way, half-closes passed on."""

    def __init__(self, sock: socket.socket, tunnel: Tunnel):
        self.sock, self.tunnel = sock, tunnel
        self.up = bytearray()  # from the socket, for the tunnel
        self.down = bytearray()  # from the tunnel, for the socket
        self.sock_eof = self.tunnel_eof = False
        self.tunnel_full = False  # the channel's window was closed last time it was tried
        self.broken = False
        self.told_tunnel = self.told_sock = False  # each side heard the other's end

    @property
    def done(self) -> bool:
        return self.broken or (self.sock_eof and self.tunnel_eof and not self.up and not self.down)

    def readers(self) -> list:
        out = []
        if not self.sock_eof and len(self.up) < BUFFER:
            out.append(self.sock)
        if not self.tunnel_eof and len(self.down) < BUFFER:
            out.append(self.tunnel)
        return out

    def writers(self) -> list:
        return [self.sock] if self.down else []

    def on_ready(self, readable: Sequence[object], writable: Sequence[object]) -> None:
        try:
            if self.sock in readable:
                self._from_sock()
            if self.tunnel in readable:
                self._from_tunnel()
            if self.sock in writable and self.down:
                del self.down[:self.sock.send(self.down)]
            self._to_tunnel()
            self._pass_half_closes()
        except BlockingIOError:
            pass
        except OSError:
            self.broken = True

    def _from_sock(self) -> None:
        data = self.sock.recv(READ)
        if data:
            self.up += data
        else:
            self.sock_eof = True

    def _from_tunnel(self) -> None:
        data = self.tunnel.recv(READ)
        if data:
            self.down += data
        else:
            self.tunnel_eof = True

    def _to_tunnel(self) -> None:
        self.tunnel_full = False
        while self.up:
            if not self.tunnel.writable():
                self.tunnel_full = bool(self.up)
                return
            sent = self.tunnel.send(bytes(self.up[:READ * 4]))
            if not sent:
                self.tunnel_full = True
                return
            del self.up[:sent]

    def _pass_half_closes(self) -> None:
        """A side that ended its sending: the other side hears the end once what came before is through."""
        if self.sock_eof and not self.up and not self.told_tunnel:
            self.told_tunnel = True
            self.tunnel.shutdown_write()
        if self.tunnel_eof and not self.down and not self.told_sock:
            self.told_sock = True
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self.broken = True

    def close(self) -> None:
        for end in (self.sock, self.tunnel):
            try:
                end.close()
            except OSError:
                pass

