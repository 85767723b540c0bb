"""`stop` on a recorded run: every rank stopped by its recorded process group, idempotent; hosts it cannot
reach stay pending for a later stop. Only this user's runs of this registry: someone else's is refused,
naming them."""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence, Tuple

from .. import outcome
from ..config.inventory import Inventory
from ..errors import HostError, NotYourRun
from ..hosts.group import on_hosts
from ..registry.store import RunRecord, RunStore, login, owner_of
from ..states import Cleanup, HostState, RunState
from .nodes import Connect, Node, nodes_of, timeouts_of
from .reconcile import conclude, record_exits


def check_owner(record: RunRecord) -> None:
    """`stop` of a run someone else launched (a registry several people share) is refused, naming them."""
    owner = owner_of(record)
    if owner and owner != login():
        raise NotYourRun(f"run {record.id} was launched by {owner} (on {(record.controller or {}).get('host', '?')}), "
                         f"not by you ({login()}): clusterrun stops only your own runs; ask {owner}")


def refuse_foreign_on(inv: Inventory, run: str) -> None:
    """A run id this registry does not know: if the claims on inv's hosts show it, say whose it is."""
    from ..hosts.claims import list_claims, run_owner
    from ..hosts.client import make_connect

    refuse_foreign(run, run_owner(list_claims(inv.hosts, make_connect(inv.timeouts)), run))


def refuse_foreign(run: str, entries: Sequence) -> None:
    """A run this registry does not know but the hosts' claims show (entries: hosts.claims.Holder):
    refused, naming whose it is; nothing is asked of the hosts beyond the listing."""
    if not entries:
        return
    e = entries[0]
    hosts = ", ".join(sorted({x.host for x in entries}))
    me = login()
    whose = f"{e.user}'s (launched by {e.by or '?'})" if e.by.split("@")[0] != me or e.user != me else \
        f"yours, but launched from {e.by} (another machine's registry)"
    raise NotYourRun(f"run {e.run} on {hosts} is {whose}, {e.state if e.kind == 'claim' else 'waiting'} since "
                     f"{time.strftime('%H:%M:%S', time.localtime(e.since))}: clusterrun stops only the runs of "
                     "this registry; stop it from where it was launched" + (f", or ask {e.user}" if e.user != me else ""))


def stop_run(store: RunStore, run_id: str, connect: Connect,
             grace: Optional[float] = None) -> Tuple[RunRecord, Dict[str, HostError]]:
    """Stop every rank by its recorded process group (TERM, grace seconds: default the run's timeouts.grace,
    KILL); idempotent; unreachable hosts stay pending. A run that has ended keeps its record as it is: only
    hosts that still owe a stop are asked (and marked)."""
    record = store.get(run_id)
    if not record.still_open:
        return record, {}
    grace = timeouts_of(record).grace if grace is None else grace
    inv, nodes = nodes_of(record)
    targets = _stop_targets(record, inv, nodes)
    current = {n.index for n in nodes}
    # by the run's own id: every attempt there
    stopped = on_hosts(targets, connect, lambda node, client: client.stop(run_id, grace), thread_name="stop")
    # every host's answer in one transaction, the ranks still open read once (not once a host: 128 hosts
    # made that 128 reads of the whole record and a commit per rank)
    open_ranks = {r.rank for r in store.get(run_id).ranks if not r.state.terminal}
    with store.batch():
        for node in targets:
            name = node.host.name
            if name in stopped.errors:
                store.update_host(run_id, node.index, cleanup=Cleanup.PENDING, error=str(stopped.errors[name]))
            elif name in stopped.results:
                _record_stopped(store, run_id, node, stopped.results[name],
                                open_ranks=open_ranks if node.index in current else None)
        if stopped.ok and not record.terminal:
            store.update_run(run_id, reason=record.reason or "stopped by `clusterrun stop`")
    if stopped.ok:  # every host answered: the run has ended
        return conclude(store, run_id, verdict=outcome.after_stop), stopped.failed
    return conclude(store, run_id, open_state=RunState.UNKNOWN), stopped.failed


def _stop_targets(record: RunRecord, inv: Inventory, nodes: List[Node]) -> List[Node]:
    """The hosts a stop asks: the current attempt's, less those of an ended run already stopped, and the
    hosts an earlier attempt left behind (lost, then dropped) that still owe a stop."""
    settled = {h.node_rank for h in record.hosts if h.cleanup in (None, Cleanup.DONE) and h.state is not HostState.LOST}
    targets = [n for n in nodes if not (record.terminal and n.index in settled)]
    current = {n.index for n in nodes}
    targets += [Node(-1, inv.hosts[h.node_rank], (), h.node_rank) for h in record.hosts
                if h.node_rank not in current and h.cleanup is Cleanup.PENDING]
    return targets


def _record_stopped(store: RunStore, run_id: str, node: Node, answer: dict, *, open_ranks: Optional[set]) -> None:
    """A host that answered the stop: the exits it reports for ranks still open (open_ranks: a host of the
    current attempt; None: an earlier attempt's), then it is done."""
    if open_ranks is not None:
        record_exits(store, run_id, node, answer.get("exits", {}), answer.get("now"), only=open_ranks)
    store.update_host(run_id, node.index, cleanup=Cleanup.DONE, state=HostState.STOPPED)
