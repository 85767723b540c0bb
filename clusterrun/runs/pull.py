"""`clusterrun pull` and the pull at the end of an attached run: files of a run's folder on its hosts,
back to this machine, any time later (the run record says where they are; hosts/pull.py speaks to the
host's `pull`).

A file is fetched only when the copy here differs from the host's (by SHA-256: a second pull of unchanged
files receives nothing). It arrives in a hidden `.NAME.part` beside its place; a pull that was cut leaves
that file, and the next one continues from its end once the host found its bytes to be the file's first
ones. Once whole, it is checked against the host's SHA-256, given the host's mode (never setuid or setgid,
group/other write only as the umask allows) and renamed into place: no half file ever has the final name.
Before the first byte, what is to be fetched is checked against the free space where it goes, every host
of the pull at once (pull_limits.py: also the cap on one file, and a host that sends more than it listed). A pull of the run's job.outputs that completed on a host is
recorded: `clean` keeps runs whose outputs were never pulled.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..config.inventory import Host, inventory_from_snapshot
from ..errors import HostError, HostsFailed, OutsideRun, PullStopped, PullTooLarge, UsageError
from ..events import HostDone, HostProgress
from ..hosts.client import HostClient
from ..hosts.group import fan_out
from ..hosts.manifest import HashCache
from ..hosts.pull import Listing, PullStream, RemoteFile, Want
from ..registry.records import RunRecord
from ..registry.store import PULLED, RunStore
from .nodes import nodes_of
from .pull_limits import check_room, file_problem, local_mode, over_listed

CHUNK = 1 << 20


@dataclass(frozen=True)
class PullTarget:
    host: Host
    folder: str  # where its files go here


@dataclass(frozen=True)
class HostPull:
    """One host's part of a pull."""

    host: str
    folder: str
    files: int  # files the PATHs selected there
    fetched: int  # files whose bytes came (new or changed); the others were here already
    received: int  # file bytes received
    resumed: int  # files continued from an earlier pull that was cut
    unmatched: Tuple[str, ...] = ()
    skipped: Tuple[Tuple[str, str], ...] = ()
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"host": self.host, "folder": self.folder, "files": self.files, "fetched": self.fetched,
                "received_bytes": self.received, "resumed": self.resumed, "unmatched": list(self.unmatched),
                "skipped": [list(s) for s in self.skipped], "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class PullResult:
    run_id: str
    paths: Tuple[str, ...]
    folder: str  # DIR: the files of one host, or a folder per host (--all-hosts)
    snapshot: bool  # the run had not ended (as far as the registry knew): its files as they were
    hosts: Tuple[HostPull, ...] = ()
    failed: Mapping[str, HostError] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        return any(isinstance(e, PullStopped) for e in self.failed.values())

    def to_json(self) -> dict:
        return {"run": self.run_id, "paths": list(self.paths), "folder": self.folder, "snapshot": self.snapshot,
                "hosts": [h.to_json() for h in self.hosts], "failed": {k: str(v) for k, v in self.failed.items()}}


def path_problem(path: str) -> Optional[str]:
    """What is wrong with a PATH given to `pull` (None: nothing). An absolute one is the host's to judge:
    it may lie in the run's folder there."""
    if ".." in path.split("/"):
        return f"{path!r} leads out of the run's folder (..); give a path inside the job folder"
    if "\0" in path or not path.strip("/. "):
        return f"{path!r} names nothing; give a file, a folder or a glob in the run's job folder"
    return None


def pull_paths(record: RunRecord, paths: Sequence[str]) -> Tuple[str, ...]:
    """The PATHs given, else the run's job.outputs; UsageError when neither names anything."""
    chosen = tuple(paths) or record.outputs
    if not chosen:
        raise UsageError(f"run {record.id}: nothing to pull: it has no job.outputs; name what to pull "
                         f"(clusterrun pull {record.id} outputs/ \"*.pt\"), or set job.outputs in the inventory")
    for path in chosen:
        problem = path_problem(path)
        if problem:
            raise UsageError(f"pull: {problem}")
    return chosen


def pull_targets(store: RunStore, record: RunRecord, host: Optional[str] = None, all_hosts: bool = False,
                 to: Optional[str] = None) -> Tuple[str, List[PullTarget]]:
    """(DIR, the hosts to pull from and where each one's files go): rank 0's host of the run's last attempt,
    the host named, or every host of the run under DIR/<host>/. Nothing is made yet."""
    inv = inventory_from_snapshot(record.snapshot)
    folder = os.path.abspath(os.path.expanduser(to)) if to else os.path.join(store.home, "runs", record.id, PULLED)
    names = [h.name for h in record.hosts]
    if all_hosts:
        return folder, [PullTarget(inv.hosts[h.node_rank], os.path.join(folder, h.name)) for h in record.hosts]
    if host is not None:
        if host not in names:
            raise UsageError(f"run {record.id} ran on {', '.join(names)}: no host {host!r} (--host NAME)")
        return folder, [PullTarget(next(h for h in inv.hosts if h.name == host), folder)]
    _, nodes = nodes_of(record)
    return folder, [PullTarget(nodes[0].host, folder)]


def pull_run(store: RunStore, run_id: str, connect: Callable[[Host], HostClient], *, paths: Sequence[str] = (),
             host: Optional[str] = None, all_hosts: bool = False, to: Optional[str] = None,
             post: Callable[[object], None] = lambda ev: None, poll: Callable[[], None] = lambda: None,
             stop: Callable[[], bool] = lambda: False) -> PullResult:
    """`clusterrun pull`: connect to the hosts, pull, close. Bad input (PATHs, --host, nothing selected)
    raises UsageError before anything is written here."""
    record = store.get(run_id)
    wanted = pull_paths(record, paths)
    folder, targets = pull_targets(store, record, host, all_hosts, to)
    clients: Dict[str, HostClient] = {}

    def client_for(h: Host) -> HostClient:
        clients[h.name] = connect(h)
        return clients[h.name]

    try:
        return pull_files(store, record, targets, client_for, wanted, folder, post=post, poll=poll, stop=stop)
    finally:
        for c in clients.values():
            c.close()


def pull_files(store: RunStore, record: RunRecord, targets: Sequence[PullTarget],
               client_for: Callable[[Host], HostClient], paths: Sequence[str], folder: str, *,
               post: Callable[[object], None], poll: Callable[[], None], stop: Callable[[], bool],
               require: bool = True) -> PullResult:
    """List on every target host at once; then (nothing refused, something selected, unless not require)
    fetch what differs from the copies here, every host at once; record the hosts that completed."""
    name = lambda t: t.host.name  # noqa: E731
    listed = fan_out(targets, lambda t: client_for(t.host).pull(record.id, paths), name=name, poll=poll,
                     thread_name="pull")
    streams: Dict[str, PullStream] = listed.results
    try:
        _refuse_bad_input(record, targets, listed.errors, streams, require,
                          ended_empty=lambda: _nothing_to_keep(store, record, targets, paths))
        sums = HashCache(os.path.join(store.home, "pull-hashes.json"))
        fetches = {t.host.name: _Fetch(t, streams[t.host.name], sums, post, stop) for t in targets
                   if t.host.name in streams}
        planned = fan_out([t for t in targets if t.host.name in fetches], lambda t: fetches[t.host.name].plan(),
                          name=name, poll=poll, thread_name="pull")
        jobs = [t for t in targets if t.host.name in planned.results]
        check_room({t.host.name: (t.folder, fetches[t.host.name].total) for t in jobs})
        done = fan_out(jobs, lambda t: fetches[t.host.name].run(), name=name, poll=poll, thread_name="pull")
        sums.save()
    finally:
        for s in streams.values():
            s.close()
    if set(record.outputs) <= set(paths):  # what `clean` waits for: the run's job.outputs came back
        for h in done.results.values():
            store.pulls.note(record.id, h.host, h.files, h.received, h.folder)
    return PullResult(record.id, tuple(paths), folder, not record.terminal,
                      tuple(done.results[t.host.name] for t in jobs if t.host.name in done.results),
                      {**listed.failed, **planned.failed, **done.failed})


def _refuse_bad_input(record: RunRecord, targets: Sequence[PullTarget], errors: Mapping[str, HostError],
                      streams: Mapping[str, PullStream], require: bool, ended_empty: Callable[[], str]) -> None:
    """A PATH a host refused, or (require) PATHs that selected nothing anywhere: UsageError, nothing written
    (ended_empty: what it means for the run, said after)."""
    refused = {n: e for n, e in errors.items() if isinstance(e, OutsideRun)}
    if refused:
        raise UsageError("pull: " + "; ".join(f"{n}: {e.message}" for n, e in refused.items()))
    listings = [s.listing for s in streams.values() if s.listing is not None]
    if require and not errors and not any(listing.files for listing in listings):
        raise UsageError(_nothing_selected(record, targets, listings) + ended_empty())
    if errors and not streams:
        raise HostsFailed("pull", errors)


def _nothing_to_keep(store: RunStore, record: RunRecord, targets: Sequence[PullTarget], paths: Sequence[str]) -> str:
    """An ended run whose job.outputs select nothing has nothing to keep: noted as pulled (with nothing), so
    `clean` and retention do not keep it for a pull that can never bring anything (and said so)."""
    if not record.terminal or not record.outputs or not set(record.outputs) <= set(paths):
        return ""
    for t in targets:
        store.pulls.note(record.id, t.host.name, 0, 0, "")
    return "; the run has ended, so it has no outputs to keep: `clusterrun clean` may remove it"


def _nothing_selected(record: RunRecord, targets: Sequence[PullTarget], listings: Sequence[Listing]) -> str:
    where = ", ".join(t.host.name for t in targets)
    what = ", ".join(sorted({p for listing in listings for p in listing.unmatched})) or "the PATHs"
    later = "" if record.terminal else " (the run may not have written them yet)"
    return f"run {record.id}: nothing to pull: {what} matched no file on {where}{later}"


def safe_target(folder: str, rel: str) -> str:
    """Where a file of the listing goes here; a name that would leave the folder is the host's lie."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise ValueError(f"unsafe name in the host's listing: {rel!r}")
    return os.path.join(folder, *parts)


def part_path(target: str) -> str:
    """The hidden file a file grows in until it is whole: .NAME.part beside it."""
    head, tail = os.path.split(target)
    return os.path.join(head, f".{tail}.part")


def set_mode(path: str, st: os.stat_result, mode: int) -> None:
    """The host's mode, as this machine lets a pulled file have it (pull_limits.local_mode)."""
    mode = local_mode(mode)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def _sha_of(path: str) -> "hashlib._Hash":
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest


class _Fetch:
    """One host's fetch: what differs from the copies here, each file into its .part, then into place."""

    def __init__(self, target: PullTarget, stream: PullStream, sums: HashCache, post: Callable[[object], None],
                 stop: Callable[[], bool]):
        self.target, self.stream, self.sums, self.post, self.stop = target, stream, sums, post, stop
        self.host = target.host.name
        self.prefix: Dict[str, "hashlib._Hash"] = {}  # rel -> hash of the .part's bytes so far
        self.total = self.done = self.resumed = self.fetched = 0
        self.current: Optional[_PartFile] = None
        self.wants: List[Want] = []

    def sink(self, f: RemoteFile) -> "_PartFile":
        self.current = _PartFile(self, f)
        return self.current

    def plan(self) -> int:
        """What to fetch (self.wants) and how many bytes that is (self.total, returned); PullTooLarge for a
        file larger than one pulled file may be."""
        listing: Listing = self.stream.listing
        problems = [p for p in (file_problem(f.rel, f.size) for f in listing.files) if p]
        if problems:
            raise PullTooLarge(self.host, problems[0] + ": nothing was fetched")
        self.wants = [w for w in (self.want(f) for f in listing.files) if w is not None]
        by_rel = {f.rel: f for f in listing.files}
        self.total = sum(by_rel[w.rel].size - w.offset for w in self.wants)
        return self.total

    def run(self) -> HostPull:
        t0 = time.monotonic()
        listing: Listing = self.stream.listing
        wants = self.wants
        self.post(HostProgress("pull", self.host, 0, self.total))
        try:
            received = self.stream.fetch(wants, self.sink) if wants else 0
        finally:
            if self.current is not None:  # the stream broke in the middle: what came stays in the .part file
                self.current.close()
        self.post(HostDone("pull", self.host, time.monotonic() - t0, sent=received, total=self.total,
                           files=self.fetched))
        return HostPull(self.host, self.target.folder, len(listing.files), self.fetched, received, self.resumed,
                        listing.unmatched, listing.skipped, time.monotonic() - t0)

    def want(self, f: RemoteFile) -> Optional[Want]:
        """None when the copy here is the host's (content and mode); else from where to fetch it, or (the
        host did not say its hash) the hash of the copy here for the host to compare."""
        target = safe_target(self.target.folder, f.rel)
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == f.size:
            sha = self.sums.sha(target, st)
            if f.sha256 is None:
                return Want(f.rel, have=sha)
            if sha == f.sha256:
                set_mode(target, st, f.mode)
                return None
        part = part_path(target)
        if os.path.isfile(part) and 0 < os.path.getsize(part) <= f.size:
            self.prefix[f.rel] = _sha_of(part)
            return Want(f.rel, os.path.getsize(part), self.prefix[f.rel].hexdigest())
        return Want(f.rel)

    def progress(self, n: int) -> None:
        self.done += n
        self.post(HostProgress("pull", self.host, self.done, self.total))
        if self.stop():
            raise PullStopped(self.host, "stopped before the pull ended; pull again to continue where it stopped")


class _PartFile:
    """The sink of one file: its .part file, appended to (or started over), then checked and renamed."""

    def __init__(self, fetch: _Fetch, f: RemoteFile):
        self.fetch, self.file = fetch, f
        self.target = safe_target(fetch.target.folder, f.rel)
        self.part = part_path(self.target)
        self.fd = -1
        self.digest = hashlib.sha256()
        self.offset = self.written = 0

    def same(self) -> None:
        set_mode(self.target, os.lstat(self.target), self.file.mode)

    def begin(self, offset: int) -> None:
        self.fetch.fetched += 1
        os.makedirs(os.path.dirname(self.target), exist_ok=True)
        self.fd = os.open(self.part, os.O_WRONLY | os.O_CREAT, 0o600)
        if offset and self.file.rel in self.fetch.prefix:
            self.digest = self.fetch.prefix[self.file.rel]
            self.fetch.resumed += 1
        os.ftruncate(self.fd, offset)
        os.lseek(self.fd, offset, os.SEEK_SET)
        self.offset = offset

    def write(self, data: bytes) -> None:
        self.written += len(data)
        problem = over_listed(self.file.rel, self.file.size, self.offset, self.written)
        if problem:
            self.close()
            os.unlink(self.part)
            raise PullTooLarge(self.fetch.host, problem)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.digest.update(data)
        self.fetch.progress(len(data))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def end(self, sha256: str, size: int) -> None:
        self.close()
        if self.digest.hexdigest() != sha256 or os.path.getsize(self.part) != size:
            os.unlink(self.part)
            raise HostError(self.fetch.host, f"{self.file.rel} arrived corrupted (SHA-256 differs): pull again")
        os.chmod(self.part, local_mode(self.file.mode))
        os.replace(self.part, self.target)
        self.fetch.sums.note(self.target, os.stat(self.target), sha256)
