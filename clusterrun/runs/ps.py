"""`ps`: the recorded runs, newest first; one that may still run while its controller is gone is brought up
to date by asking its hosts (reconcile.py). Light to import: a registry of ended runs is listed without
loading SSH, the inventory reader or YAML."""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from ..errors import HostError
from ..registry.records import RunRecord
from ..registry.store import RunStore

Listed = Tuple[RunRecord, Dict[str, HostError]]  # a run, and the hosts that could not be asked about it


def listed_runs(store: RunStore, last: int, connect_of: Callable[[RunRecord], Callable], *,
                ask_hosts: bool = True) -> List[Listed]:
    """The newest `last` runs; with ask_hosts, each that may still run brought up to date from its hosts."""
    out: List[Listed] = []
    for run_id in store.ids(limit=last):
        record = store.get(run_id)
        problems: Dict[str, HostError] = {}
        if ask_hosts and record.still_open:
            from .reconcile import reconcile  # only where a host must be asked: SSH is a heavy import

            record, problems = reconcile(store, run_id, connect_of(record))
        out.append((record, problems))
    return out
