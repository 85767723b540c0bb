"""job.outputs of an attached run (launch/runner.py): pulled back from rank 0's host when the run ends
(a failed run's too). Nothing here changes the run's result."""

from __future__ import annotations

from typing import Callable

from ..config.sizes import size_text
from ..errors import ClusterrunError
from ..events import Notice, Phase, counted
from ..hosts.client import HostClient
from ..outcome import RunOutcome
from ..registry.store import RunStore
from ..states import RankState

Say = Callable[[object], None]


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
        drain()  # every host's tally in before the phase's line (a pull's last word came after its last poll)
    except ClusterrunError as exc:
        emit(Notice(f"job.outputs not pulled: {exc}; `clusterrun pull {run_id}` later", "warning"))
        return
    for h in pulled.hosts:
        unmatched = f"; matched nothing: {', '.join(h.unmatched)}" if h.unmatched else ""
        emit(Notice(f"job.outputs: {counted(h.files, 'file')} from {h.host} in {h.folder} ({h.fetched} fetched, "
                    f"{size_text(h.received)}){unmatched}"))
    for err in pulled.failed.values():
        emit(Notice(f"job.outputs not pulled: {err}; `clusterrun pull {run_id}` later", "warning"))
