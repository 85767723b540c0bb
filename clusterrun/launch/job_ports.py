"""job.ports of an attached run (launch/runner.py): each reaches localhost:PORT on rank 0's host from
127.0.0.1:PORT here while the run lives. Nothing here changes the run's result."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, List, Sequence

from ..events import Forwarded, Notice
from ..hosts.client import HostClient
from ..hosts.group import background

Say = Callable[[object], None]


class PortForwards:
    """job.ports, in one background loop (transport/forward.py); a port taken here is passed over, said
    once. rank0: the connection to rank 0's host of the attempt being run (restarts may move rank 0)."""

    def __init__(self, ports: Sequence[int], rank0: Callable[[], HostClient], rank0_name: str, emit: Say, post: Say):
        from ..transport.forward import Forwarder, PortSpec

        note = lambda text: post(Notice(f"job.ports: {text}", "warning"))  # noqa: E731
        forwarder = Forwarder(lambda port: rank0().transport.tunnel(port), [PortSpec(p, p) for p in ports],
                              on_note=note, on_taken=lambda spec, why: emit(Notice(
                                  f"job.ports: {why}: port {spec.remote} not forwarded", "warning")))
        for spec in forwarder.bound:  # queued: shown once the run's own lines begin
            post(Forwarded(spec.remote, spec.local, rank0_name))
        self._stop: List[bool] = []
        self._served: "Future[None]" = background(forwarder.serve, lambda: bool(self._stop), thread_name="forward")

    def stop(self) -> None:
        self._stop.append(True)
        try:
            self._served.result(timeout=2.0)
        except Exception:  # the forwarding loop's end must not change the run's
            pass
