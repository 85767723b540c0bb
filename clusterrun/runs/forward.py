"""`clusterrun forward` on a recorded run: ports here reach localhost:PORT on the run's rank 0 host (or
another of its hosts) until Ctrl-C or the run's end, which the host is asked about every few seconds
beside the forwarding (transport/forward.py does the forwarding itself)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Callable, List, Optional, Sequence, Tuple

from ..config.inventory import Host, inventory_from_snapshot
from ..errors import HostError, UsageError
from ..hosts.client import HostClient
from ..hosts.group import background
from ..plan import attempt_key
from ..registry.records import RunRecord
from ..registry.store import RunStore
from ..transport.forward import Forwarder, PortSpec
from .nodes import nodes_of

WATCH_EVERY_S = 2.0


def forward_host(record: RunRecord, host: Optional[str]) -> Host:
    """Rank 0's host of the run's last attempt, or the host named (one the run ran on)."""
    if host is None:
        return nodes_of(record)[1][0].host
    names = [h.name for h in record.hosts]
    if host not in names:
        raise UsageError(f"run {record.id} ran on {', '.join(names)}: no host {host!r} (--host NAME)")
    return next(h for h in inventory_from_snapshot(record.snapshot).hosts if h.name == host)


class RunWatch:
    """Whether the run has ended on the host, asked every few seconds in the background (a slow answer
    never holds the forwarding up)."""

    def __init__(self, client: HostClient, key: str, every: float = WATCH_EVERY_S):
        self.client, self.key, self.every = client, key, every
        self._asked: Optional[Future] = None
        self._last = 0.0
        self.over = False

    def ended(self) -> bool:
        if self.over:
            return True
        now = time.monotonic()
        if self._asked is not None and self._asked.done():
            self.over = self._ended(self._asked)
            self._asked = None
        if self._asked is None and now - self._last >= self.every and not self.over:
            self._last = now
            self._asked = background(self.client.status, self.key, thread_name="forward-watch")
        return self.over

    @staticmethod
    def _ended(answer: Future) -> bool:
        try:
            status = answer.result()
        except HostError:  # unreachable for a moment: the tunnels say more than we could
            return False
        return bool(status.get("done")) or not status.get("started", True)


def forward_run(store: RunStore, run_id: str, connect: Callable[[Host], HostClient], specs: Sequence[PortSpec], *,
                host: Optional[str] = None, stop: Callable[[], bool] = lambda: False,
                on_ready: Callable[[str, List[PortSpec]], None] = lambda host, ports: None,
                on_note: Callable[[str], None] = lambda text: None) -> Tuple[str, str]:
    """Forward until stop() or the run's end; (the host, why it ended: "stopped" | "the run ended"). A run
    that has already ended there, or a local port taken, is a UsageError (nothing listens then)."""
    record = store.get(run_id)
    target = forward_host(record, host)
    key = attempt_key(run_id, record.attempt)
    client = connect(target)
    try:
        status = client.status(key)
        if status.get("done") or not status.get("started"):
            why = "it has ended" if status.get("started") else "it never started there"
            raise UsageError(f"run {run_id} is not running on {target.name} ({why}); forward reaches a port "
                             "while the run lives")
        forwarder = Forwarder(client.transport.tunnel, specs, on_note=on_note)
        on_ready(target.name, forwarder.bound)
        watch = RunWatch(client, key)
        forwarder.serve(lambda: stop() or watch.ended())
        return target.name, "the run ended" if watch.over else "stopped"
    finally:
        client.close()
