"""The registry's history of a run beyond its current attempt: earlier attempts (job.restarts), and what
`clean` removed (run folders on hosts; whole records here, each leaving a one-line tombstone).

A mixin of RunStore (registry/store.py): it uses the store's connection, lock and log paths.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..outcome import RankResult
from ..states import RankState, RunState


def rank_json(r: RankResult) -> dict:
    return {"rank": r.rank, "node_rank": r.node_rank, "host": r.host, "state": RankState(r.state).value,
            "exit_code": r.exit_code, "signal": r.signal, "started_at": r.started_at, "ended_at": r.ended_at,
            "note": r.note or None, "stop_reason": r.stop_reason or None, "result": r.describe()}


@dataclass(frozen=True)
class AttemptRecord:
    """One finished attempt of a run that restarts (job.restarts): where it ran and how it ended."""

    attempt: int
    started_at: Optional[float]
    ended_at: Optional[float]
    hosts: Tuple[str, ...]
    world_size: int
    state: RunState
    exit_code: Optional[int]
    reason: str
    dropped: Tuple[str, ...]  # hosts of the attempt before that this one went on without, with why
    plan: Dict[str, Any]
    ranks: Tuple[RankResult, ...]

    def to_json(self) -> dict:
        return {"attempt": self.attempt, "started_at": self.started_at, "ended_at": self.ended_at,
                "hosts": list(self.hosts), "world_size": self.world_size, "state": self.state.value,
                "exit_code": self.exit_code, "reason": self.reason, "dropped": list(self.dropped),
                "ranks": [rank_json(r) for r in self.ranks]}


class History:
    def archive_attempt(self, run_id: str, dropped: List[str] = ()) -> None:
        """Keep the current attempt (its plan, hosts, ranks and end) in the attempts table."""
        record = self.get(run_id)
        ranks = json.dumps([rank_json(r) for r in record.ranks])
        hosts = json.dumps([n["name"] for n in record.plan.get("nodes", [])])
        started = min((r.started_at for r in record.ranks if r.started_at), default=record.created_at)
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (run_id, record.attempt, started, time.time(), hosts,
                              record.plan.get("world_size"), record.state.value, record.exit_code, record.reason,
                              json.dumps(list(dropped)), json.dumps(record.plan), ranks))

    def begin_attempt(self, run_id: str, attempt: int, plan: dict, ranks: List[dict]) -> None:
        """The next attempt: its plan, and its ranks (renumbered over the hosts still there), pending."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM ranks WHERE run_id = ?", (run_id,))
            for r in ranks:
                self._db.execute("INSERT INTO ranks (run_id, rank, node_rank, host, state) "
                                 "VALUES (?, ?, ?, ?, 'pending')", (run_id, r["rank"], r["node_rank"], r["host"]))
            self._db.execute("UPDATE runs SET attempt = ?, plan = ?, state = 'running', exit_code = NULL, "
                             "reason = NULL, ended_at = NULL WHERE id = ?", (attempt, json.dumps(plan), run_id))

    def _attempts(self, run_id: str) -> Tuple[AttemptRecord, ...]:
        rows = self._db.execute("SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,)).fetchall()
        out = []
        for a in rows:
            ranks = tuple(RankResult(rank=r["rank"], node_rank=r["node_rank"], host=r["host"],
                                     state=RankState(r["state"]), exit_code=r["exit_code"], signal=r["signal"],
                                     started_at=r["started_at"], ended_at=r["ended_at"],
                                     log_path=self.log_file(run_id, r["rank"], a["attempt"]),
                                     note=r.get("note") or "", stop_reason=r.get("stop_reason") or "")
                          for r in json.loads(a["ranks"] or "[]"))
            out.append(AttemptRecord(a["attempt"], a["started_at"], a["ended_at"], tuple(json.loads(a["hosts"])),
                                     a["world_size"] or 0, RunState(a["state"]), a["exit_code"], a["reason"] or "",
                                     tuple(json.loads(a["dropped"] or "[]")), json.loads(a["plan"] or "{}"), ranks))
        return tuple(out)

    # -------------------------------------------------------------- clean

    def note_cleaned(self, run_id: str, host: str, freed: int) -> None:
        """`clean` removed this run's folder on this host."""
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO cleaned VALUES (?, ?, ?, ?)", (run_id, host, time.time(), freed))

    def cleaned(self, run_id: str) -> Dict[str, float]:
        """Hosts this run's folder was removed from, and when."""
        with self._lock:
            return {r["host"]: r["at"] for r in self._db.execute("SELECT host, at FROM cleaned WHERE run_id = ?",
                                                                 (run_id,))}

    def prune(self, run_id: str) -> None:
        """Drop the run's record and local log copies; a one-line tombstone stays (id, state, exit, times)."""
        record = self.get(run_id)
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT OR REPLACE INTO tombstones VALUES (?, ?, ?, ?, ?, ?)",
                             (run_id, record.state.value, record.exit_code, record.created_at, record.ended_at,
                              time.time()))
            for table, key in (("ranks", "run_id"), ("hosts", "run_id"), ("attempts", "run_id"),
                               ("cleaned", "run_id"), ("runs", "id")):
                self._db.execute(f"DELETE FROM {table} WHERE {key} = ?", (run_id,))
        shutil.rmtree(os.path.join(self.home, "runs", run_id), ignore_errors=True)

    def tombstones(self) -> List[Dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute("SELECT * FROM tombstones ORDER BY id DESC")]
