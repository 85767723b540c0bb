"""The run registry: one SQLite file in the state dir, plus a local copy of every rank's log.

State dir: $CLUSTERRUN_HOME, else $XDG_STATE_HOME/clusterrun, else ~/.local/state/clusterrun (0700).
The record holds what later commands need to reach the hosts again (inventory snapshot and plan; secret
names only, never values), and is written in transactions, so a controller killed at any point leaves
a record that `ps`, `logs` and `stop` can finish.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import RunNotFound, UsageError
from ..outcome import RankResult, exit_state
from ..remote.host.procs import start_ticks
from ..states import Cleanup, HostState, RankState, RunState
from .history import AttemptRecord, History, rank_json

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, created_at REAL, inventory TEXT, snapshot TEXT, plan TEXT, state TEXT,
  exit_code INTEGER, reason TEXT, ended_at REAL, controller TEXT, detached INTEGER DEFAULT 0, phases TEXT);
CREATE TABLE IF NOT EXISTS hosts (
  run_id TEXT, node_rank INTEGER, name TEXT, state TEXT, cleanup TEXT, error TEXT, supervisor_pid INTEGER,
  pushed_bytes INTEGER, push_seconds REAL, restarts INTEGER, relayed_bytes INTEGER, PRIMARY KEY (run_id, node_rank));
CREATE TABLE IF NOT EXISTS ranks (
  run_id TEXT, rank INTEGER, node_rank INTEGER, host TEXT, state TEXT, exit_code INTEGER, signal INTEGER,
  started_at REAL, ended_at REAL, pid INTEGER, note TEXT, stop_reason TEXT, PRIMARY KEY (run_id, rank));
CREATE TABLE IF NOT EXISTS tombstones (
  id TEXT PRIMARY KEY, state TEXT, exit_code INTEGER, created_at REAL, ended_at REAL, removed_at REAL);
CREATE TABLE IF NOT EXISTS cleaned (run_id TEXT, host TEXT, at REAL, bytes INTEGER, PRIMARY KEY (run_id, host));
CREATE TABLE IF NOT EXISTS attempts (
  run_id TEXT, attempt INTEGER, started_at REAL, ended_at REAL, hosts TEXT, world_size INTEGER, state TEXT,
  exit_code INTEGER, reason TEXT, dropped TEXT, plan TEXT, ranks TEXT, PRIMARY KEY (run_id, attempt));
"""

# columns added after schema 1 first shipped, for registries that predate them
_ADDED_COLUMNS = (("runs", "phases TEXT"), ("hosts", "pushed_bytes INTEGER"), ("hosts", "push_seconds REAL"),
                  ("hosts", "restarts INTEGER"), ("ranks", "stop_reason TEXT"), ("runs", "attempt INTEGER"),
                  ("runs", "restarts INTEGER"), ("hosts", "relayed_bytes INTEGER"))


def state_dir() -> str:
    if os.environ.get("CLUSTERRUN_HOME"):
        return os.path.expanduser(os.environ["CLUSTERRUN_HOME"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "clusterrun")


def new_run_id(now: Optional[float] = None) -> str:
    """Sorts by time: 20261130-142233-a1b2."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{random.SystemRandom().randrange(16 ** 4):04x}"


def controller_identity() -> dict:
    """Who is launching: enough to tell later whether that controller still runs."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "ticks": start_ticks(os.getpid())}


def controller_alive(ident: Optional[dict]) -> bool:
    """Is the controller that wrote this record still running (same machine, same pid, same start)?"""
    if not ident or ident.get("host") != socket.gethostname() or not ident.get("pid"):
        return False
    try:
        os.kill(ident["pid"], 0)
    except (ProcessLookupError, PermissionError):
        return False
    return ident.get("ticks") is None or start_ticks(ident["pid"]) == ident["ticks"]


class StateError(UsageError):
    """The registry cannot be used as it is (written by a newer clusterrun, say)."""


@dataclass(frozen=True)
class HostRecord:
    node_rank: int
    name: str
    state: HostState
    cleanup: Optional[Cleanup]  # pending: clusterrun still owes this host a stop
    error: Optional[str]
    supervisor_pid: Optional[int]
    pushed_bytes: Optional[int]
    push_seconds: Optional[float]
    restarts: int = 0  # launcher torchrun: how often it restarted this host's workers
    relayed_bytes: int = 0  # relay push: object bytes this host got from another host, not from the controller

    def to_json(self) -> dict:
        return {"node_rank": self.node_rank, "name": self.name, "state": self.state.value,
                "cleanup": self.cleanup.value if self.cleanup else None, "error": self.error,
                "supervisor_pid": self.supervisor_pid, "pushed_bytes": self.pushed_bytes,
                "push_seconds": self.push_seconds, "restarts": self.restarts, "relayed_bytes": self.relayed_bytes}


@dataclass(frozen=True)
class RunRecord:
    id: str
    created_at: float
    inventory: str
    snapshot: Dict[str, Any]
    plan: Dict[str, Any]
    state: RunState
    exit_code: Optional[int]
    reason: Optional[str]
    ended_at: Optional[float]
    controller: Optional[Dict[str, Any]]
    detached: bool
    phases: Dict[str, float]  # seconds per phase of the launch: connect, push, start, run
    hosts: Tuple[HostRecord, ...]
    ranks: Tuple[RankResult, ...]  # the current (last) attempt's
    attempt: int = 0
    restarts: int = 0  # how many attempts after the first the run may have
    attempts: Tuple[AttemptRecord, ...] = ()  # the finished ones before the current

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def cleanup_pending(self) -> List[str]:
        return [h.name for h in self.hosts if h.cleanup is Cleanup.PENDING]

    def to_json(self) -> dict:
        return {"id": self.id, "state": self.state.value, "exit_code": self.exit_code, "reason": self.reason,
                "created_at": self.created_at, "ended_at": self.ended_at, "inventory": self.inventory,
                "detached": self.detached, "phases": self.phases, "hosts": [h.to_json() for h in self.hosts],
                "ranks": [rank_json(r) for r in self.ranks], "cleanup_pending": self.cleanup_pending,
                "attempt": self.attempt, "restarts": self.restarts,
                "attempts": [a.to_json() for a in self.attempts]}


class RunStore(History):
    def __init__(self, home: Optional[str] = None):
        self.home = home or state_dir()
        os.makedirs(self.home, mode=0o700, exist_ok=True)
        path = os.path.join(self.home, "runs.db")
        fresh = not os.path.exists(path)
        # one connection shared by the controller's threads, serialised by a lock
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        if fresh:
            os.chmod(path, 0o600)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # commits survive the controller being killed; only an OS crash could lose the newest ones, and
        # an fsync per commit (dozens per launch) would put disk latency on the launch's critical path
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        with self._db:
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise StateError(f"{path} was written by a newer clusterrun (registry schema {row[0]}, this one "
                                 f"reads {SCHEMA_VERSION}); upgrade clusterrun or set CLUSTERRUN_HOME elsewhere")
            self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Registries made before a column existed get it (columns are only ever added)."""
        for table, column in _ADDED_COLUMNS:
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if column.split()[0] not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    def close(self) -> None:
        self._db.close()

    # -------------------------------------------------------------- writing

    def create(self, run_id: str, inventory: str, snapshot: dict, plan: dict, controller: dict,
               hosts: List[dict], ranks: List[dict], restarts: int = 0) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT INTO runs (id, created_at, inventory, snapshot, plan, state, controller, attempt, "
                             "restarts) VALUES (?, ?, ?, ?, ?, 'starting', ?, 0, ?)",
                             (run_id, time.time(), inventory, json.dumps(snapshot), json.dumps(plan),
                              json.dumps(controller), restarts))
            for h in hosts:
                self._db.execute("INSERT INTO hosts (run_id, node_rank, name, state) VALUES (?, ?, ?, 'pending')",
                                 (run_id, h["node_rank"], h["name"]))
            for r in ranks:
                self._db.execute("INSERT INTO ranks (run_id, rank, node_rank, host, state) "
                                 "VALUES (?, ?, ?, ?, 'pending')", (run_id, r["rank"], r["node_rank"], r["host"]))

    def update_run(self, run_id: str, **fields: Any) -> None:
        if "plan" in fields:
            fields["plan"] = json.dumps(fields["plan"])
        for name in ("controller", "phases"):
            if name in fields and fields[name] is not None:
                fields[name] = json.dumps(fields[name])
        self._update("runs", "id = ?", (run_id,), fields)

    def update_host(self, run_id: str, node_rank: int, **fields: Any) -> None:
        self._update("hosts", "run_id = ? AND node_rank = ?", (run_id, node_rank), fields)

    def update_rank(self, run_id: str, rank: int, **fields: Any) -> None:
        self._update("ranks", "run_id = ? AND rank = ?", (run_id, rank), fields)

    def record_exit(self, run_id: str, rank: int, info: Mapping[str, Any], clock_offset: float) -> None:
        """A host's exit record of a rank, its times moved to this machine's clock (offset: host minus here)."""
        started, ended = info.get("started_at"), info.get("ended_at")
        self.update_rank(run_id, rank, state=exit_state(info), exit_code=info.get("exit_code"),
                         signal=info.get("signal"), started_at=started - clock_offset if started else None,
                         ended_at=(ended - clock_offset) if ended else time.time(), note=info.get("error"),
                         stop_reason=info.get("stop_reason"))

    def _update(self, table: str, where: str, key: tuple, fields: Dict[str, Any]) -> None:
        if not fields:
            return
        cols = ", ".join(f"{name} = ?" for name in fields)
        values = tuple(v.value if isinstance(v, Enum) else v for v in fields.values())
        with self._lock, self._db:
            self._db.execute(f"UPDATE {table} SET {cols} WHERE {where}", values + key)

    # -------------------------------------------------------------- reading

    def get(self, run_id: str) -> RunRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in {self.home}")
            hosts = tuple(HostRecord(
                node_rank=h["node_rank"], name=h["name"], state=HostState(h["state"]),
                cleanup=Cleanup(h["cleanup"]) if h["cleanup"] else None, error=h["error"],
                supervisor_pid=h["supervisor_pid"], pushed_bytes=h["pushed_bytes"], push_seconds=h["push_seconds"],
                restarts=h["restarts"] or 0, relayed_bytes=h["relayed_bytes"] or 0)
                for h in self._db.execute("SELECT * FROM hosts WHERE run_id = ? ORDER BY node_rank", (run_id,)))
            ranks = tuple(RankResult(
                rank=r["rank"], node_rank=r["node_rank"], host=r["host"], state=RankState(r["state"]),
                exit_code=r["exit_code"], signal=r["signal"], started_at=r["started_at"], ended_at=r["ended_at"],
                log_path=self.log_file(run_id, r["rank"], row["attempt"] or 0), note=r["note"] or "",
                stop_reason=r["stop_reason"] or "")
                for r in self._db.execute("SELECT * FROM ranks WHERE run_id = ? ORDER BY rank", (run_id,)))
            attempts = self._attempts(run_id)
        return RunRecord(id=row["id"], created_at=row["created_at"], inventory=row["inventory"],
                         snapshot=json.loads(row["snapshot"]), plan=json.loads(row["plan"]),
                         state=RunState(row["state"]),
                         exit_code=row["exit_code"], reason=row["reason"], ended_at=row["ended_at"],
                         controller=json.loads(row["controller"]) if row["controller"] else None,
                         detached=bool(row["detached"]), phases=json.loads(row["phases"] or "{}"),
                         hosts=hosts, ranks=ranks, attempt=row["attempt"] or 0, restarts=row["restarts"] or 0,
                         attempts=attempts)

    def ids(self, limit: Optional[int] = None) -> List[str]:
        sql = "SELECT id FROM runs ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        with self._lock:
            return [r[0] for r in self._db.execute(sql)]

    def resolve(self, ref: Optional[str]) -> str:
        """A run id from an id, a unique prefix of one, or `latest` (also the default)."""
        if ref in (None, "", "latest"):
            ids = self.ids(limit=1)
            if not ids:
                raise RunNotFound(f"no runs yet in {self.home}")
            return ids[0]
        matches = [r[0] for r in self._db.execute("SELECT id FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY id",
                                                  (ref.replace("\\", "\\\\").replace("%", "\\%")
                                                   .replace("_", "\\_") + "%",))]
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

    def _attempt_dir(self, run_id: str, attempt: int) -> str:
        folder = self.log_dir(run_id)
        if attempt:
            folder = os.path.join(folder, f"attempt-{attempt}")
            os.makedirs(folder, 0o700, exist_ok=True)
        return folder

    def log_path(self, run_id: str, rank: int, attempt: int = 0) -> str:
        """The local copy of a rank's log (of one attempt: every attempt keeps its own), folder made if needed."""
        return os.path.join(self._attempt_dir(run_id, attempt), f"rank-{rank}.log")

    def aux_log_path(self, run_id: str, host: str, stream: str, attempt: int = 0) -> str:
        """The local copy of a host's other output (its setup, torchrun's own messages)."""
        return os.path.join(self._attempt_dir(run_id, attempt), f"{host}-{stream}.log")

    def log_file(self, run_id: str, rank: int, attempt: int = 0) -> str:
        """Where the local copy of a rank's log is (or would be); makes nothing."""
        parts = [self.home, "runs", run_id] + ([f"attempt-{attempt}"] if attempt else [])
        return os.path.join(*parts, f"rank-{rank}.log")
