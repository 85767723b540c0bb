"""What one launch holds of each host, under one lock (the push threads, the starts and the monitor all
reach it): the open connection (by the host's place in the inventory: restarts renumber node ranks), the
push each host holds open for its start, the follow stream its start left flowing (an attached launch),
and which hosts of the attempt have started (those are the ones an undo stops)."""

from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional

from ..config.inventory import Host
from ..hosts.client import HostClient
from ..hosts.push import HeldPush
from ..hosts.wire import FollowStream


class Closed(Exception):
    """The launch was given up while a host was connecting: its connection is not kept. Internal, not a
    ClusterrunError: the runner turns it into Interrupted at once (Runner._connect_node)."""


class HostSet:
    def __init__(self, connect: Callable[[Host], HostClient]):
        self._connect = connect
        self._lock = threading.Lock()
        self._clients: Dict[int, HostClient] = {}  # by inventory index
        self._held: Dict[int, HeldPush] = {}  # by node rank: pushed, waiting for the start on the push's channel
        self._streams: Dict[int, FollowStream] = {}  # by node rank: started and followed on that channel
        self._started: List[int] = []  # node ranks of the attempt being started
        self._closing = False

    # connections -------------------------------------------------------------------------------
    def connect(self, index: int, host: Host) -> HostClient:
        """A connection to the host at this place in the inventory, kept (Closed: the launch was given up)."""
        client = self._connect(host)
        with self._lock:
            if self._closing:
                client.close()
                raise Closed(host.name)
            old, self._clients[index] = self._clients.get(index), client
        if old is not None:
            old.close()
        return client

    def existing(self, index: int) -> Optional[HostClient]:
        with self._lock:
            return self._clients.get(index)

    def client(self, index: int) -> HostClient:
        with self._lock:
            return self._clients[index]

    # pushes held open, follow streams, starts --------------------------------------------------
    def hold(self, node_rank: int, held: HeldPush) -> None:
        with self._lock:
            self._held[node_rank] = held

    def held(self, node_rank: int) -> HeldPush:
        with self._lock:
            return self._held[node_rank]

    def all_held(self) -> Dict[int, HeldPush]:
        with self._lock:
            return dict(self._held)

    def take_held(self, node_rank: int) -> HeldPush:
        with self._lock:
            return self._held.pop(node_rank)

    def following(self, node_rank: int, stream: FollowStream) -> None:
        with self._lock:
            self._streams[node_rank] = stream

    def take_streams(self) -> Dict[int, FollowStream]:
        with self._lock:
            streams, self._streams = self._streams, {}
        return streams

    def started(self, node_rank: int) -> None:
        with self._lock:
            self._started.append(node_rank)

    def new_attempt(self) -> None:
        with self._lock:
            self._started = []

    def started_ones(self) -> List[int]:
        with self._lock:
            return list(self._started)

    # ends --------------------------------------------------------------------------------------
    def abandon_held(self) -> None:
        """Hosts that received the job but were not started remove it when their channel closes."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for h in held:
            h.abandon()

    def close(self) -> None:
        """The launch is over: what was held or never followed goes, then every connection."""
        with self._lock:
            self._closing = True
        self.abandon_held()
        for stream in self.take_streams().values():
            stream.close()
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.close()
