"""Which run folders may go (pure): a host's listing (remote/host/disk/runs.py), the rules, and what this
machine's registry knows about each run.

Never removed: a run that runs or may still run (its host says running or being received; the registry
says it has not ended, a stop is pending on a host, or its controller still lives: a restart may follow).
Runs this registry does not know ("foreign": another user's or another machine's controller) stay unless
asked for by id or with --foreign: their logs have no local copy to keep. A run whose outputs
(job.outputs) were never pulled stays unless --force: they exist nowhere else. Abandoned pushes (a folder
that was never started and that no push holds) always go.

The rules: ids named → exactly those; else keep the newest `keep` finished runs of the host and/or remove
the ones older than `older_than` (both given: a run goes when either says so, as retention's keep_runs
and max_age do); neither → every finished run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from ..registry.store import RunRecord, controller_alive


@dataclass(frozen=True)
class Rules:
    keep: Optional[int] = None  # newest finished runs kept per host
    older_than_s: Optional[float] = None
    runs: Tuple[str, ...] = ()  # exactly these
    foreign: bool = False  # also runs this registry does not know
    force: bool = False  # also runs whose outputs were never pulled

    def describe(self) -> str:
        if self.runs:
            return "the runs named"
        parts = ([f"keep the newest {self.keep}"] if self.keep is not None else []) + \
            ([f"older than {duration_text(self.older_than_s)}"] if self.older_than_s is not None else [])
        return " or ".join(parts) if parts else "every finished run"


@dataclass(frozen=True)
class Decision:
    run_id: str
    remove: bool
    why: str  # why it goes, or why it stays
    bytes: int = 0  # what removing it frees (files only it links)
    ours: bool = True
    listed: Optional[dict] = None  # the host's listing entry


def protected(record: Optional[RunRecord]) -> str:
    """Why the registry says this run may still run ("" when it may go)."""
    if record is None:
        return ""
    if not record.terminal:
        return f"the registry says {record.state.value}"
    if record.cleanup_pending:
        return "a stop is pending on " + ", ".join(record.cleanup_pending)
    if controller_alive(record.controller):
        return "its controller still runs (a restart may follow)"
    return ""


UNPULLED = "outputs never pulled"


def unpulled(record: Optional[RunRecord], rules: Rules, entry: Optional[dict] = None) -> str:
    """Why a run stays for its outputs ("" when it may go): it names job.outputs and no pull of them
    completed, and --force was not given; not when its host says they selected nothing (entry: its
    listing's, `outputs_found`): such a run has nothing to keep."""
    if record is None or rules.force or not record.outputs_unpulled:
        return ""
    if entry is not None and entry.get("outputs_found") is False:
        return ""
    return f"{UNPULLED}: `clusterrun pull {record.id}` first, or --force"


def select_removals(listing: Sequence[dict], rules: Rules, records: Mapping[str, Optional[RunRecord]],
                    now: float) -> Tuple[Decision, ...]:
    """A decision for every run folder of one host; records: this registry's record by run id (None:
    a tombstone, a run this registry removed from its records but knew)."""
    out = []
    finished = []
    for entry in listing:
        run_id = entry["id"]
        ours = run_id in records
        keep_why = _kept_anyway(entry, rules, records)
        if keep_why:
            out.append(Decision(run_id, False, keep_why, entry.get("bytes", 0), ours, entry))
        elif entry["status"] == "unstarted":
            out.append(Decision(run_id, True, "pushed but never started", entry.get("bytes", 0), ours, entry))
        else:
            finished.append(entry)
    finished.sort(key=lambda e: e["id"], reverse=True)  # run ids sort by their start time
    for i, entry in enumerate(finished):
        why = _removed_by_rules(rules, i, now - float(entry.get("ended_at") or now))
        out.append(Decision(entry["id"], bool(why), why or "kept by the rules", entry.get("bytes", 0),
                            entry["id"] in records, entry))
    return tuple(sorted(out, key=lambda d: d.run_id))


def _kept_anyway(entry: dict, rules: Rules, records: Mapping[str, Optional[RunRecord]]) -> str:
    """Why a run folder stays whatever the rules say ("" when they decide)."""
    run_id, status = entry["id"], entry["status"]
    if status in ("running", "receiving"):
        return f"{status}: {entry.get('why') or status}"
    still = protected(records.get(run_id))
    if still:
        return "may still run: " + still
    if rules.runs and run_id not in rules.runs:
        return "not named"
    if status == "finished" and unpulled(records.get(run_id), rules, entry):
        return unpulled(records.get(run_id), rules, entry)
    if run_id not in records and not rules.runs and not rules.foreign:
        return "not this registry's run (--foreign to include it)"
    return ""


def _removed_by_rules(rules: Rules, newer: int, age: float) -> str:
    """Why a finished run goes ("" when the rules keep it); newer: how many of the host's finished runs are
    newer, age: seconds since it ended."""
    if rules.runs:
        return "named"
    if rules.keep is None and rules.older_than_s is None:
        return "finished"
    why = ""
    if rules.keep is not None and newer >= rules.keep:
        why = f"beyond the newest {rules.keep}"
    if rules.older_than_s is not None and age > rules.older_than_s:
        why = why or f"ended {duration_text(age)} ago (older than {duration_text(rules.older_than_s)})"
    return why


def duration_text(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            value = seconds / size
            return f"{value:.0f}{unit}" if value >= 10 or value == int(value) else f"{value:.1f}{unit}"
    return f"{seconds:.0f}s"
