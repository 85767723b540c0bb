"""`clusterrun clean` on the hosts, and retention after a launch: list every host's run folders, select
what goes (clean/policy.py), bring the local log copies of the runs about to go up to date, then have each
host remove them (each one re-checked there) and collect its cache.

Also `clean --local` (the registry and its log copies, by the same rules, leaving tombstones), and
`ps --disk` (what each run keeps on its hosts, from the same listing).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..config.inventory import Host, inventory_from_snapshot
from ..errors import ConnectError, HostError
from ..hosts.client import HostClient
from ..hosts.group import GroupResult, fan_out, on_hosts
from ..registry.store import RunRecord, RunStore
from ..runs.logs import fetch_logs
from .policy import Decision, Rules, protected, select_removals, unpulled

Connect = Callable[[Host], HostClient]


@dataclass
class HostClean:
    """One host's part of a clean: what went (or would), what stayed and why, the cache, the disk after."""

    host: str
    decisions: Tuple[Decision, ...] = ()
    removed: List[dict] = field(default_factory=list)  # {id, bytes}
    refused: List[dict] = field(default_factory=list)  # {id, why}: named, or started since it was listed
    cache: Optional[dict] = None
    usage: dict = field(default_factory=dict)
    error: Optional[HostError] = None
    envs: Optional[dict] = None  # job.environment's venvs that went: {removed: [{key, bytes}], in_use, bytes}

    @property
    def freed(self) -> int:
        return sum(r["bytes"] for r in self.removed) + ((self.cache or {}).get("bytes") or 0) + \
            ((self.envs or {}).get("bytes") or 0)

    def to_json(self) -> dict:
        return {"host": self.host, "removed": self.removed, "refused": self.refused,
                "kept": [{"id": d.run_id, "why": d.why} for d in self.decisions if not d.remove],
                "cache": self.cache, "envs": self.envs, "usage": self.usage, "freed": self.freed,
                "error": str(self.error) if self.error else None}


def target_of(host: Host) -> tuple:
    return (host.connection, host.host, host.port, host.user, host.workdir)


def hosts_of_runs(store: RunStore, run_ids: Sequence[str]) -> List[Host]:
    """Every host any of these runs was launched on (from their recorded inventories), once each; two
    different machines that share a name in different inventories are told apart as NAME@HOST."""
    seen: Dict[tuple, Host] = {}
    for run_id in run_ids:
        for host in inventory_from_snapshot(store.get(run_id).snapshot).hosts:
            seen.setdefault(target_of(host), host)
    names: Dict[str, int] = {}
    for host in seen.values():
        names[host.name] = names.get(host.name, 0) + 1
    return [replace(h, name=f"{h.name}@{h.host}") if names[h.name] > 1 else h for h in seen.values()]


def disk_usage(store: RunStore, run_ids: Sequence[str], connect: Connect) -> dict:
    """`ps --disk`: run id → {bytes (files only the run links: logs, outputs), job_bytes (its links into the
    cache), hosts: {name: bytes}, removed_from: [hosts `clean` removed it from]}; every host asked once."""
    asked = on_hosts(hosts_of_runs(store, run_ids), connect, lambda host, client: client.runs(),
                     host=lambda host: host, thread_name="disk")
    wanted = set(run_ids)
    out = {run_id: {"bytes": 0, "job_bytes": 0, "hosts": {}, "removed_from": sorted(store.cleaned.hosts(run_id))}
           for run_id in run_ids}
    for name, answer in asked.results.items():
        for entry in answer.get("runs", []):
            if entry["id"] in wanted:
                cell = out[entry["id"]]
                cell["bytes"] += entry["bytes"]
                cell["job_bytes"] += entry["job_bytes"]
                cell["hosts"][name] = entry["bytes"]
    return out


def known_runs(store: RunStore) -> Dict[str, Optional[RunRecord]]:
    """This registry's runs by id; runs it removed from its records (tombstones) map to None."""
    out: Dict[str, Optional[RunRecord]] = {t["id"]: None for t in store.cleaned.tombstones()}
    out.update({run_id: store.get(run_id) for run_id in store.ids()})
    return out


def clean_hosts(hosts: Sequence[Host], store: RunStore, connect: Connect, rules: Rules, *, cache: bool = False,
                cache_max: Optional[int] = None, dry_run: bool = False,
                on_problem: Callable[[str], None] = lambda text: None) -> List[HostClean]:
    records = known_runs(store)
    clients: Dict[str, HostClient] = {}
    out = {h.name: HostClean(h.name) for h in hosts}

    def listing(host: Host) -> dict:
        clients[host.name] = connect(host)
        return clients[host.name].runs()

    # venvs no run used for as long as an old run is kept (never for `clean RUN...`); --cache: every unused one
    envs_age = rules.older_than_s if not rules.runs else None

    def remove(host: Host) -> dict:
        gone = [d.run_id for d in out[host.name].decisions if d.remove]
        envs = out[host.name].usage.get("envs_count") and (envs_age is not None or cache)
        if not gone and not cache and cache_max is None and not envs:
            return {"removed": [], "refused": [], "cache": None, "usage": out[host.name].usage}
        return clients[host.name].clean({"remove": gone, "cache": cache, "cache_max": cache_max,
                                         "envs_max_age": envs_age, "dry_run": dry_run})

    try:
        listed = fan_out(hosts, listing, name=lambda h: h.name, thread_name="clean")
        _take_listings(out, listed, rules, records)
        if not dry_run:  # on the connections the listing made (not a second handshake with every host)
            lend = lambda host: _Lent(clients[host.name]) if host.name in clients else connect(host)  # noqa: E731
            _copy_logs(store, lend, list(out.values()), records, on_problem)
        done = fan_out([h for h in hosts if h.name in listed.results], remove, name=lambda h: h.name,
                       thread_name="clean")
        for name, err in done.errors.items():
            out[name].error = err
        with store.batch():  # every host's removals noted in one commit
            for name, answer in done.results.items():
                _take_clean(out[name], answer, set(rules.runs))
                if not dry_run:
                    _note_removed(store, records, out[name])
        _report_unlisted(rules, list(out.values()), on_problem)
    finally:
        for c in clients.values():
            c.close()
    return list(out.values())


def _take_listings(out: Dict[str, HostClean], listed: GroupResult, rules: Rules,
                   records: Dict[str, Optional[RunRecord]]) -> None:
    """Each listed host's decisions, judged by the host's own clock where it tells it."""
    now = time.time()
    for name, err in listed.errors.items():
        out[name].error = err
    for name, answer in listed.results.items():
        out[name].decisions = select_removals(answer["runs"], rules, records, answer.get("now", now))
        out[name].usage = answer.get("usage", {})


def _take_clean(h: HostClean, answer: dict, named: set) -> None:
    """What the host removed, refused and collected; named runs it kept count as refused."""
    h.removed, h.cache, h.envs = answer.get("removed", []), answer.get("cache"), answer.get("envs")
    h.usage = {**h.usage, **answer.get("usage", {})}
    h.refused = [r for r in answer.get("refused", []) if not (r.get("missing") and r["id"] not in named)]
    h.refused += [{"id": d.run_id, "why": d.why} for d in h.decisions
                  if not d.remove and d.run_id in named]


def _note_removed(store: RunStore, records: Dict[str, Optional[RunRecord]], h: HostClean) -> None:
    """This registry's runs remember the hosts they were removed from (ps --disk's removed_from); a run
    whose job.outputs selected nothing there is noted as pulled with nothing (so `clean --local` and
    retention let its record go too: there was nothing to keep)."""
    empty = {d.run_id for d in h.decisions if d.remove and (d.listed or {}).get("outputs_found") is False}
    for r in h.removed:
        if r["id"] in records and records[r["id"]] is not None:
            store.cleaned.note(r["id"], h.host, r["bytes"])
            if r["id"] in empty and records[r["id"]].outputs_unpulled:
                store.pulls.note(r["id"], h.host, 0, 0, "")


def _report_unlisted(rules: Rules, hosts: List[HostClean], on_problem: Callable[[str], None]) -> None:
    listed_ids = {d.run_id for h in hosts for d in h.decisions}
    for run_id in sorted(set(rules.runs) - listed_ids):  # named, but on none of its hosts any more
        on_problem(f"{run_id}: no folder of it on its hosts (removed before?)")


class _Lent:
    """One of clean's connections, lent to the log copy (fetch_logs): its close() leaves it open for the
    removal that follows; clean closes it at its end."""

    def __init__(self, client: HostClient):
        self._client = client

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def close(self) -> None:
        pass


def _copy_logs(store: RunStore, connect: Connect, hosts: List[HostClean], records: Dict[str, Optional[RunRecord]],
               on_problem: Callable[[str], None]) -> None:
    """Before a run of this registry goes, its local log copies get every byte the hosts have (each
    attempt's). A run whose copies cannot be completed stays (the decision is withdrawn)."""
    failed = set()
    for run_id, attempts in sorted(_lacking_logs(store, hosts, records).items()):
        for attempt in sorted(attempts):
            problems: List[str] = []
            fetch_logs(store, run_id, connect, follow=False, on_lines=lambda ev: None, on_problem=problems.append,
                       attempt=attempt)
            if problems:
                failed.add(run_id)
                on_problem(f"{run_id}: kept: its logs could not be copied first ({'; '.join(problems)})")
    if failed:
        for h in hosts:
            h.decisions = tuple(Decision(d.run_id, False, "its logs could not be copied first", d.bytes, d.ours,
                                         d.listed) if d.remove and d.run_id in failed else d for d in h.decisions)


def _lacking_logs(store: RunStore, hosts: List[HostClean], records: Dict[str, Optional[RunRecord]]) -> Dict[str, set]:
    """Run id → the attempts of which some host has more log than the local copy, for this registry's runs
    about to go."""
    lacking: Dict[str, set] = {}
    for h in hosts:
        for d in h.decisions:
            record = records.get(d.run_id)
            if not d.remove or record is None:
                continue
            for attempt, sizes in (d.listed or {}).get("logs", {}).items():
                for rank, size in sizes.items():
                    if _size(store.log_file(d.run_id, int(rank), int(attempt))) < size:
                        lacking.setdefault(d.run_id, set()).add(int(attempt))
    return lacking


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def clean_local(store: RunStore, rules: Rules, dry_run: bool = False) -> List[Tuple[str, bool, str]]:
    """The registry and its log copies by the same rules: (run id, removed?, why) for every run; a run that
    may still run is kept. A removed run leaves a tombstone, which `clean` still counts as this registry's
    (so its folders on the hosts can go later)."""
    entries = []
    records = {}
    for run_id in store.ids():
        record = store.get(run_id)
        records[run_id] = record
        why = protected(record) or unpulled(record, rules)
        status = "running" if why else "finished"
        entries.append({"id": run_id, "status": status, "why": why, "bytes": _local_bytes(store, run_id),
                        "ended_at": record.ended_at or record.created_at})
    out = []
    for d in select_removals(entries, Rules(rules.keep, rules.older_than_s, rules.runs, foreign=True,
                                            force=rules.force), records, time.time()):
        if d.remove and not dry_run:
            store.prune(d.run_id)
        out.append((d.run_id, d.remove, d.why))
    return out


def _local_bytes(store: RunStore, run_id: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(os.path.join(store.home, "runs", run_id)):
        total += sum(_size(os.path.join(root, f)) for f in files)
    return total


def exit_code(results: Sequence[HostClean]) -> int:
    """0; 3 when a host could not be reached (and nothing else went wrong); 1 when a host refused or failed."""
    if any(h.refused or (h.error is not None and not isinstance(h.error, ConnectError)) for h in results):
        return 1
    return 3 if any(isinstance(h.error, ConnectError) for h in results) else 0
