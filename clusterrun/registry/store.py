"""The run registry: one SQLite file in the state dir (db.py), plus a local copy of every rank's log.

State dir: $CLUSTERRUN_HOME, else $XDG_STATE_HOME/clusterrun, else ~/.local/state/clusterrun (0700).
The record holds what later commands need to reach the hosts again (inventory snapshot and plan; secret
names only, never values), and is written in transactions, so a controller killed at any point leaves
a record that `ps`, `logs` and `stop` can finish. A run's final state is written by `conclude` only,
from a RunOutcome (outcome.py decides; the store keeps).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import threading
import time
from typing import Any, Dict, List, Optional

from ..errors import RunNotFound
from ..outcome import RankResult, RunOutcome
from ..remote.host.procs import start_ticks
from ..states import Cleanup, HostState, RankState, RunState
from .db import Db, StateError  # noqa: F401  (StateError: part of the store's interface)
from .history import AttemptLog, CleanLog, PullLog
from .records import HostRecord, RunRecord

PULLED = "outputs"  # runs/RUN/outputs/: what `pull` brought back (kept when the record is pruned)

__all__ = ["RunStore", "RunRecord", "HostRecord", "StateError", "state_dir", "controller_identity",
           "controller_alive", "login", "owner_of"]


def state_dir() -> str:
    if os.environ.get("CLUSTERRUN_HOME"):
        return os.path.expanduser(os.environ["CLUSTERRUN_HOME"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "clusterrun")


def controller_identity() -> dict:
    """Who is launching: enough to tell later whether that controller still runs, and whose run it is."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "ticks": start_ticks(os.getpid()), "user": login()}


def login() -> str:
    """This process's user, by its uid in the password database: never $LOGNAME or $USER, which anyone
    sets (`LOGNAME=alice clusterrun stop` must not pass for alice). Where there is no such database
    (Windows) or no entry, getpass's guess."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, AttributeError):
        pass
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def owner_of(record: "RunRecord") -> str:
    """Who launched the run ("" when the record does not say: made before it was kept)."""
    return str((record.controller or {}).get("user") or "")


def controller_alive(ident: Optional[dict]) -> bool:
    """Is the controller that wrote this record still running (same machine, same pid, same start)?"""
    if not ident or ident.get("host") != socket.gethostname() or not ident.get("pid"):
        return False
    try:
        os.kill(ident["pid"], 0)
    except (ProcessLookupError, PermissionError):
        return False
    return ident.get("ticks") is None or start_ticks(ident["pid"]) == ident["ticks"]


class RunStore:
    """The registry. `attempts` (finished attempts of runs that restart), `cleaned` (what `clean`
    removed, tombstones) and `pulls` (pulls of a run's files that completed) are logs it owns."""

    def __init__(self, home: Optional[str] = None):
        self.home = home or state_dir()
        os.makedirs(self.home, mode=0o700, exist_ok=True)
        self._db = Db(self.home)
        self.attempts = AttemptLog(self._db, self.log_file)
        self.cleaned = CleanLog(self._db)
        self.pulls = PullLog(self._db)
        self._later: Dict[tuple, Dict[str, Any]] = {}  # (run id, host index) -> fields (update_host_later)
        self._later_lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    # -------------------------------------------------------------- writing

    def update_host_later(self, run_id: str, index: int, **fields: Any) -> None:
        """update_host from a host's thread: kept until the next flush() (the runner's main thread, every
        50 ms of a fan-out and at its end), which writes every host's rows in one commit, not one a host."""
        with self._later_lock:
            self._later.setdefault((run_id, index), {}).update(fields)

    def flush(self) -> None:
        """The rows update_host_later kept, in one transaction."""
        with self._later_lock:
            rows, self._later = self._later, {}
        if rows:
            with self.batch():
                for (run_id, index), fields in rows.items():
                    self.update_host(run_id, index, **fields)

    def batch(self):
        """A context: this thread's writes in it as one transaction (Db.batch): the writes of many hosts'
        events, or of a loop over the hosts, cost one commit."""
        return self._db.batch()

    def create(self, run_id: str, inventory: str, snapshot: dict, plan: dict, controller: dict,
               hosts: List[dict], ranks: List[dict], restarts: int = 0) -> None:
        with self._db.transaction() as db:
            db.execute("INSERT INTO runs (id, created_at, inventory, snapshot, plan, state, controller, attempt, "
                       "restarts) VALUES (?, ?, ?, ?, ?, 'starting', ?, 0, ?)",
                       (run_id, time.time(), inventory, json.dumps(snapshot), json.dumps(plan),
                        json.dumps(controller), restarts))
            for h in hosts:
                db.execute("INSERT INTO hosts (run_id, node_rank, name, state) VALUES (?, ?, ?, 'pending')",
                           (run_id, h["node_rank"], h["name"]))
            _insert_ranks(db, run_id, ranks)

    def begin_attempt(self, run_id: str, attempt: int, plan: dict, ranks: List[dict]) -> None:
        """The next attempt: its plan, and its ranks (renumbered over the hosts still there), pending."""
        with self._db.transaction() as db:
            db.execute("DELETE FROM ranks WHERE run_id = ?", (run_id,))
            _insert_ranks(db, run_id, ranks)
            db.execute("UPDATE runs SET attempt = ?, plan = ?, state = 'running', exit_code = NULL, "
                       "reason = NULL, ended_at = NULL WHERE id = ?", (attempt, json.dumps(plan), run_id))

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Anything of the run but its end: a final state comes only through `conclude`."""
        state = fields.get("state")
        if state is not None and RunState(state).terminal:
            raise ValueError(f"run {run_id}: a final state ({state}) is written by conclude(outcome) only")
        for name in ("plan", "controller", "phases"):
            if name in fields and fields[name] is not None:
                fields[name] = json.dumps(fields[name])
        self._db.update("runs", "id = ?", (run_id,), fields)

    def reopen(self, run_id: str) -> None:
        """The attempt that ended goes on to another (job.restarts): the run is running again."""
        self._db.update("runs", "id = ?", (run_id,), {"state": RunState.RUNNING, "exit_code": None, "ended_at": None})

    def conclude(self, outcome: RunOutcome, ended_at: Optional[float] = None) -> None:
        """The run's end, as outcome.py decided it; ranks still pending never started."""
        self._db.update("runs", "id = ?", (outcome.run_id,),
                        {"state": outcome.state, "exit_code": outcome.exit_code, "reason": outcome.reason,
                         "ended_at": ended_at or time.time()})
        self._db.execute("UPDATE ranks SET state = ? WHERE run_id = ? AND state = ?",
                         (RankState.NOT_STARTED.value, outcome.run_id, RankState.PENDING.value))

    def update_host(self, run_id: str, index: int, **fields: Any) -> None:
        """index: the host's place in the inventory (the hosts table's key)."""
        self._db.update("hosts", "run_id = ? AND node_rank = ?", (run_id, index), fields)

    def update_rank(self, run_id: str, rank: int, **fields: Any) -> None:
        self._db.update("ranks", "run_id = ? AND rank = ?", (run_id, rank), fields)

    def record_rank(self, run_id: str, result: RankResult) -> None:
        """How a rank ended, already on this machine's clock (RankResult.from_exit corrected it)."""
        self.update_rank(run_id, result.rank, state=result.state, exit_code=result.exit_code,
                         signal=result.signal, started_at=result.started_at, ended_at=result.ended_at,
                         note=result.note or None, stop_reason=result.stop_reason or None)

    def prune(self, run_id: str) -> None:
        """Drop the run's record and local log copies; a one-line tombstone stays (id, state, exit, times)."""
        record = self.get(run_id)
        with self._db.transaction() as db:
            db.execute("INSERT OR REPLACE INTO tombstones VALUES (?, ?, ?, ?, ?, ?)",
                       (run_id, record.state.value, record.exit_code, record.created_at, record.ended_at,
                        time.time()))
            for table, key in (("ranks", "run_id"), ("hosts", "run_id"), ("attempts", "run_id"),
                               ("cleaned", "run_id"), ("pulls", "run_id"), ("runs", "id")):
                db.execute(f"DELETE FROM {table} WHERE {key} = ?", (run_id,))
        _drop_log_copies(os.path.join(self.home, "runs", run_id))

    # -------------------------------------------------------------- reading

    def get(self, run_id: str) -> RunRecord:
        self.flush()  # a record read here includes the rows still kept for a commit
        rows = self._db.rows("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise RunNotFound(f"no run {run_id!r} in {self.home}")
        row = rows[0]
        hosts = tuple(HostRecord(
            node_rank=h["node_rank"], name=h["name"], state=HostState(h["state"]),
            cleanup=Cleanup(h["cleanup"]) if h["cleanup"] else None, error=h["error"],
            supervisor_pid=h["supervisor_pid"], pushed_bytes=h["pushed_bytes"], push_seconds=h["push_seconds"],
            restarts=h["restarts"] or 0, relayed_bytes=h["relayed_bytes"] or 0,
            push_detail=json.loads(h["push_detail"]) if h["push_detail"] else None,
            stack=json.loads(h["stack"]) if h["stack"] else None)
            for h in self._db.rows("SELECT * FROM hosts WHERE run_id = ? ORDER BY node_rank", (run_id,)))
        attempt = row["attempt"] or 0
        ranks = tuple(RankResult.from_record(r, self.log_file(run_id, r["rank"], attempt))
                      for r in self._db.rows("SELECT * FROM ranks WHERE run_id = ? ORDER BY rank", (run_id,)))
        return RunRecord(id=row["id"], created_at=row["created_at"], inventory=row["inventory"],
                         snapshot=json.loads(row["snapshot"]), plan=json.loads(row["plan"]),
                         state=RunState(row["state"]), exit_code=row["exit_code"], reason=row["reason"],
                         ended_at=row["ended_at"],
                         controller=json.loads(row["controller"]) if row["controller"] else None,
                         detached=bool(row["detached"]), phases=json.loads(row["phases"] or "{}"),
                         hosts=hosts, ranks=ranks, attempt=attempt, restarts=row["restarts"] or 0,
                         attempts=self.attempts.of(run_id), pulled=tuple(sorted(self.pulls.hosts(run_id))))

    def open_ids(self) -> List[str]:
        """Runs that may still have ranks running, newest first: not ended, or ended with a host that still
        owes a stop (what `stop` without a RUN looks among)."""
        final = tuple(s.value for s in RunState if s.terminal)
        return [r[0] for r in self._db.rows(
            f"SELECT id FROM runs WHERE state NOT IN ({', '.join('?' * len(final))}) OR id IN "
            "(SELECT run_id FROM hosts WHERE cleanup = ?) ORDER BY created_at DESC, id DESC",
            final + (Cleanup.PENDING.value,))]

    def ids(self, limit: Optional[int] = None) -> List[str]:
        # newest first by when each was made: two ids of the same second sort by their random part only
        sql = "SELECT id FROM runs ORDER BY created_at DESC, id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        return [r[0] for r in self._db.rows(sql)]

    def resolve(self, ref: Optional[str]) -> str:
        """A run id from an id, a unique prefix of one, or `latest` (also the default)."""
        if ref in (None, "", "latest"):
            ids = self.ids(limit=1)
            if not ids:
                raise RunNotFound(f"no runs yet in {self.home}")
            return ids[0]
        pattern = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        matches = [r[0] for r in self._db.rows("SELECT id FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY id",
                                               (pattern,))]
        if not matches:
            raise RunNotFound(f"no run matches {ref!r} (see `clusterrun ps`)")
        if len(matches) > 1 and ref not in matches:
            raise RunNotFound(f"{ref!r} matches {len(matches)} runs ({', '.join(matches[:4])}...); give more of the id")
        return ref if ref in matches else matches[0]

    # -------------------------------------------------------------- local log copies

    def log_dir(self, run_id: str) -> str:
        runs = os.path.join(self.home, "runs")
        path = os.path.join(runs, run_id)
        for folder in (runs, path):  # makedirs' mode applies to the last folder only
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                pass
        return path

    def log_folder(self, run_id: str, attempt: int = 0) -> str:
        """The folder of one attempt's local log copies, made if needed (log_file's paths are in it)."""
        return self._attempt_dir(run_id, attempt)

    def _attempt_dir(self, run_id: str, attempt: int) -> str:
        folder = self.log_dir(run_id)
        if attempt:
            folder = os.path.join(folder, f"attempt-{attempt + 1}")
            os.makedirs(folder, 0o700, exist_ok=True)
        return folder

    def log_path(self, run_id: str, rank: int, attempt: int = 0) -> str:
        """The local copy of a rank's log (of one attempt: every attempt keeps its own), folder made if needed."""
        return os.path.join(self._attempt_dir(run_id, attempt), f"rank-{rank}.log")

    def aux_log_path(self, run_id: str, host: str, stream: str, attempt: int = 0) -> str:
        """The local copy of a host's other output (its setup, torchrun's own messages)."""
        return os.path.join(self._attempt_dir(run_id, attempt), f"{host}-{stream}.log")

    def outputs_dir(self, run_id: str) -> str:
        """Where `pull` puts a run's files by default: runs/RUN/outputs/ (made, 0700)."""
        path = os.path.join(self.log_dir(run_id), PULLED)
        os.makedirs(path, 0o700, exist_ok=True)
        return path

    def log_file(self, run_id: str, rank: int, attempt: int = 0) -> str:
        """Where the local copy of a rank's log is (or would be); makes nothing."""
        parts = [self.home, "runs", run_id] + ([f"attempt-{attempt + 1}"] if attempt else [])
        return os.path.join(*parts, f"rank-{rank}.log")


def _drop_log_copies(folder: str) -> None:
    """A pruned run's folder here loses its log copies; what was pulled (outputs/) is the user's and stays."""
    if not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        if name == PULLED:
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    if not os.listdir(folder):
        os.rmdir(folder)


def _insert_ranks(db, run_id: str, ranks: List[dict]) -> None:
    for r in ranks:
        db.execute("INSERT INTO ranks (run_id, rank, node_rank, host, state) VALUES (?, ?, ?, ?, 'pending')",
                   (run_id, r["rank"], r["node_rank"], r["host"]))
