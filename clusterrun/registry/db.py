"""The registry's SQLite file: its schema (versioned; columns are only ever added), one connection shared
by the controller's threads and serialised by a lock, and the writes every part of the registry makes."""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager
from enum import Enum
from typing import Any, Dict, Iterator

from ..errors import StateError

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, created_at REAL, inventory TEXT, snapshot TEXT, plan TEXT, state TEXT,
  exit_code INTEGER, reason TEXT, ended_at REAL, controller TEXT, detached INTEGER DEFAULT 0, phases TEXT);
CREATE TABLE IF NOT EXISTS hosts (
  run_id TEXT, node_rank INTEGER, name TEXT, state TEXT, cleanup TEXT, error TEXT, supervisor_pid INTEGER,
  pushed_bytes INTEGER, push_seconds REAL, restarts INTEGER, relayed_bytes INTEGER, push_detail TEXT,
  stack TEXT, PRIMARY KEY (run_id, node_rank));
CREATE TABLE IF NOT EXISTS ranks (
  run_id TEXT, rank INTEGER, node_rank INTEGER, host TEXT, state TEXT, exit_code INTEGER, signal INTEGER,
  started_at REAL, ended_at REAL, pid INTEGER, note TEXT, stop_reason TEXT, PRIMARY KEY (run_id, rank));
CREATE TABLE IF NOT EXISTS tombstones (
  id TEXT PRIMARY KEY, state TEXT, exit_code INTEGER, created_at REAL, ended_at REAL, removed_at REAL);
CREATE TABLE IF NOT EXISTS cleaned (run_id TEXT, host TEXT, at REAL, bytes INTEGER, PRIMARY KEY (run_id, host));
CREATE TABLE IF NOT EXISTS pulls (
  run_id TEXT, host TEXT, at REAL, files INTEGER, bytes INTEGER, folder TEXT, PRIMARY KEY (run_id, host));
CREATE TABLE IF NOT EXISTS attempts (
  run_id TEXT, attempt INTEGER, started_at REAL, ended_at REAL, hosts TEXT, world_size INTEGER, state TEXT,
  exit_code INTEGER, reason TEXT, dropped TEXT, plan TEXT, ranks TEXT, PRIMARY KEY (run_id, attempt));
"""

# columns added after schema 1 first shipped, for registries that predate them
_ADDED_COLUMNS = (("runs", "phases TEXT"), ("hosts", "pushed_bytes INTEGER"), ("hosts", "push_seconds REAL"),
                  ("hosts", "restarts INTEGER"), ("ranks", "stop_reason TEXT"), ("runs", "attempt INTEGER"),
                  ("runs", "restarts INTEGER"), ("hosts", "relayed_bytes INTEGER"), ("hosts", "push_detail TEXT"),
                  ("hosts", "stack TEXT"))


class Db:
    """runs.db in the state dir (0600), in WAL mode."""

    def __init__(self, home: str):
        path = os.path.join(home, "runs.db")
        fresh = not os.path.exists(path)
        self.lock = threading.RLock()
        self._batching = False  # inside batch(): writes join its transaction (only its thread holds the lock)
        self.commits = 0  # transactions written (the batching's tests count them)
        self.conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        if fresh:
            os.chmod(path, 0o600)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        # commits survive the controller being killed; only an OS crash could lose the newest ones, and
        # an fsync per commit (dozens per launch) would put disk latency on the launch's critical path
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA busy_timeout=30000")
        with self.conn:
            self.conn.executescript(_SCHEMA)
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self.conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise StateError(f"{path} was written by a newer clusterrun (registry schema {row[0]}, this one "
                                 f"reads {SCHEMA_VERSION}); upgrade clusterrun or set CLUSTERRUN_HOME elsewhere")
            self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Registries made before a column existed get it (columns are only ever added)."""
        for table, column in _ADDED_COLUMNS:
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            if column.split()[0] not in have:
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Several writes as one (BEGIN IMMEDIATE ... COMMIT), under the lock; inside batch(), part of its."""
        with self.lock:
            if self._batching:
                yield self.conn
                return
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                yield self.conn
            self.commits += 1

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every write of this thread in the block as one transaction: the writes of many hosts' events
        handled at once cost one commit, not one each. Other threads' writes wait for its end; nested
        batches join the outer one. What was written is kept even when the block raises."""
        with self.lock:
            if self._batching:
                yield
                return
            self.conn.execute("BEGIN IMMEDIATE")
            self._batching = True
            try:
                yield
            finally:
                self._batching = False
                self.conn.execute("COMMIT")
                self.commits += 1

    def execute(self, sql: str, params: tuple = ()) -> None:
        with self.lock:
            if self._batching:
                self.conn.execute(sql, params)
                return
            with self.conn:
                self.conn.execute(sql, params)
            self.commits += 1

    def rows(self, sql: str, params: tuple = ()) -> list:
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    def update(self, table: str, where: str, key: tuple, fields: Dict[str, Any]) -> None:
        if not fields:
            return
        cols = ", ".join(f"{name} = ?" for name in fields)
        values = tuple(v.value if isinstance(v, Enum) else v for v in fields.values())
        self.execute(f"UPDATE {table} SET {cols} WHERE {where}", values + key)

    def close(self) -> None:
        self.conn.close()
