"""The registry's history of a run beyond its current attempt, each kept by an object the store owns:
`AttemptLog`, the finished attempts of a run that restarts (job.restarts), `CleanLog`, what `clean`
removed (run folders on hosts; whole records here, each leaving a one-line tombstone), and `PullLog`, the
pulls of its outputs that completed (`clean` keeps a run whose outputs were never pulled)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..outcome import RankResult
from ..states import RunState
from .db import Db

from .records import AttemptRecord, RunRecord


class AttemptLog:
    """The attempts table. log_file(run_id, rank, attempt) says where a rank's local log copy is."""

    def __init__(self, db: Db, log_file: Callable[[str, int, int], str]):
        self._db = db
        self._log_file = log_file

    def archive(self, record: RunRecord, dropped: Sequence[str] = ()) -> None:
        """Keep the run's current attempt, which just ended (its plan, hosts, ranks and end)."""
        plan = record.plan
        hosts = json.dumps([n["name"] for n in plan.get("nodes", [])])
        started = min((r.started_at for r in record.ranks if r.started_at), default=record.created_at)
        self._db.execute("INSERT OR REPLACE INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (record.id, record.attempt, started, time.time(), hosts, plan.get("world_size"),
                          record.state.value, record.exit_code, record.reason, json.dumps(list(dropped)),
                          json.dumps(plan), json.dumps([r.to_json() for r in record.ranks])))

    def of(self, run_id: str) -> Tuple[AttemptRecord, ...]:
        out = []
        for a in self._db.rows("SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,)):
            ranks = tuple(RankResult.from_record(r, self._log_file(run_id, r["rank"], a["attempt"]))
                          for r in _rank_rows(a["ranks"]))
            out.append(AttemptRecord(a["attempt"], a["started_at"], a["ended_at"], tuple(json.loads(a["hosts"])),
                                     a["world_size"] or 0, RunState(a["state"]), a["exit_code"], a["reason"] or "",
                                     tuple(json.loads(a["dropped"] or "[]")), json.loads(a["plan"] or "{}"), ranks))
        return tuple(out)


def _rank_rows(text: Optional[str]) -> List[dict]:
    """An archived attempt's ranks, with the keys a `ranks` row has (older archives lack some)."""
    keys = ("exit_code", "signal", "started_at", "ended_at", "note", "stop_reason")
    return [{**{k: None for k in keys}, **r} for r in json.loads(text or "[]")]


class CleanLog:
    """What `clean` removed: run folders on hosts (`cleaned`), and records pruned here (`tombstones`)."""

    def __init__(self, db: Db):
        self._db = db

    def note(self, run_id: str, host: str, freed: int) -> None:
        """`clean` removed this run's folder on this host."""
        self._db.execute("INSERT OR REPLACE INTO cleaned VALUES (?, ?, ?, ?)", (run_id, host, time.time(), freed))

    def hosts(self, run_id: str) -> Dict[str, float]:
        """Hosts this run's folder was removed from, and when."""
        return {r["host"]: r["at"] for r in self._db.rows("SELECT host, at FROM cleaned WHERE run_id = ?", (run_id,))}

    def tombstones(self) -> List[Dict[str, Any]]:
        return [dict(r) for r in self._db.rows("SELECT * FROM tombstones ORDER BY id DESC")]


class PullLog:
    """The pulls of a run's files that completed, per host: the last one's time, files, bytes, folder."""

    def __init__(self, db: Db):
        self._db = db

    def note(self, run_id: str, host: str, files: int, received: int, folder: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO pulls VALUES (?, ?, ?, ?, ?, ?)",
                         (run_id, host, time.time(), files, received, folder))

    def hosts(self, run_id: str) -> Dict[str, float]:
        """Hosts the run's files were pulled from, and when (the last time)."""
        return {r["host"]: r["at"] for r in self._db.rows("SELECT host, at FROM pulls WHERE run_id = ?", (run_id,))}
