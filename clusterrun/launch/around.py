"""Around an attached run (launch/runner.py): job.ports reached from here while the run lives, and
job.outputs pulled back when it ends. Nothing here changes the run's result."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, List, Sequence

from ..config.sizes import size_text
from ..errors import ClusterrunError
from ..events import Notice, Phase
from ..hosts.client import HostClient
from ..hosts.group import background
from ..outcome import RunOutcome
from ..registry.store import RunStore
from ..states import RankState

Say = Callable[[object], None]


class PortForwards:
    """job.ports: each reaches localhost:PORT on rank 0's host from 127.0.0.1:PORT here while the run lives,
    in one background loop (hosts/forward.py); a port taken here is passed over, said once. rank0: the
    connection to rank 0's host of the attempt being run (restarts may move rank 0)."""

    def __init__(self, ports: Sequence[int], rank0: Callable[[], HostClient], rank0_name: str, emit: Say, post: Say):
        from ..hosts.forward import Forwarder, PortSpec, banner

        note = lambda text: post(Notice(f"job.ports: {text}", "warning"))  # noqa: E731
        forwarder = Forwarder(lambda port: rank0().transport.tunnel(port), [PortSpec(p, p) for p in ports],
                              on_note=note, on_taken=lambda spec, why: emit(Notice(
                                  f"job.ports: {why}: port {spec.remote} not forwarded", "warning")))
        for spec in forwarder.bound:  # queued: shown once the run's own lines begin
            post(Notice(banner(spec.remote, spec.local, rank0_name), "info"))
        self._stop: List[bool] = []
        self._served: "Future[None]" = background(forwarder.serve, lambda: bool(self._stop), thread_name="forward")

    def stop(self) -> None:
        self._stop.append(True)
        try:
            self._served.result(timeout=2.0)
        except Exception:  # the forwarding loop's end must not change the run's
            pass


def pull_outputs(store: RunStore, run_id: str, result: RunOutcome, rank0: Callable[[], HostClient], *, emit: Say,
                 post: Say, drain: Callable[[], None], stopped: Callable[[], bool]) -> None:
    """job.outputs from rank 0's host over its open connection, into runs/RUN/outputs/ here (the registry
    notes it: `clean` keeps runs whose outputs were never pulled). stopped (a Ctrl-C) ends the pull, which
    the next `clusterrun pull` continues."""
    if any(r.state is RankState.LOST and r.node_rank == 0 for r in result.ranks):
        emit(Notice(f"job.outputs not pulled: rank 0's host was lost; `clusterrun pull {run_id}` once it is back",
                    "warning"))
        return
    from ..runs.pull import pull_files, pull_targets

    record = store.get(run_id)
    folder, targets = pull_targets(store, record)
    emit(Phase("pull"))
    try:
        pulled = pull_files(store, record, targets, lambda host: rank0(), record.outputs, folder, post=post,
                            poll=drain, stop=stopped, require=False)
    except ClusterrunError as exc:
        emit(Notice(f"job.outputs not pulled: {exc}; `clusterrun pull {run_id}` later", "warning"))
        return
    for h in pulled.hosts:
        unmatched = f"; matched nothing: {', '.join(h.unmatched)}" if h.unmatched else ""
        emit(Notice(f"job.outputs: {h.files} files from {h.host} in {h.folder} ({h.fetched} fetched, "
                    f"{size_text(h.received)}){unmatched}"))
    for err in pulled.failed.values():
        emit(Notice(f"job.outputs not pulled: {err}; `clusterrun pull {run_id}` later", "warning"))
