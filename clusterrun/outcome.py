"""How a run ended, worked out in one place: the live monitor, the attempt loop, the launch's failures,
and `ps`/`stop` (the registry) all get their verdict from here, so the same rank reads the same wherever
it is shown, and no other module builds a `RunOutcome` or names a run's final state (a test holds this).

The root cause leads (torchrun's "first observed failure"): of the ranks that failed or were lost, the
one that ended first on the controller's clock (host clocks corrected), ties broken by rank.
"""

from __future__ import annotations

import ipaddress
import re
import signal as _signal
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Mapping, Optional, Sequence, Tuple

from .errors import EXIT_FAILED, ClusterrunError, HostsFailed
from .remote.host.words import (INTERRUPTED, behind_text, how_it_ended, rank_failed, signal_name,
                                time_limit_reached)
from .states import RankState, RunState

HUNG = "hung:"  # the stop reason the supervisors give a run stopped by job.hang_timeout (remote/host/run/hang.py)
OOM = "killed by the OOM killer"  # how a host's exit record names a rank the kernel killed for memory


@dataclass(frozen=True)
class RankResult:
    """One rank as it ended (or stands), its times on the controller's clock: built from a host's exit
    record (`from_exit`, which corrects the host's clock) or read back from the registry (`from_record`)."""

    rank: int
    node_rank: int
    host: str
    state: RankState
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None  # controller clock (host clock corrected by the measured offset)
    log_path: str = ""
    tail: Tuple[str, ...] = ()
    note: str = ""
    stop_reason: str = ""  # why it was stopped, when it was (time-limit, failed elsewhere, ...)
    nccl: Optional[Mapping[str, Any]] = None  # a hung rank's last NCCL collective (Flight Recorder): seq, op, state

    @classmethod
    def from_exit(cls, rank: int, node_rank: int, host: str, info: Mapping[str, Any], *, clock_offset: float,
                  log_path: str = "") -> "RankResult":
        """A host's exit record (remote/host/run/supervisor.py writes them); clock_offset: that host's clock
        minus this one's, so every time lands on the controller's clock."""
        started, ended = info.get("started_at"), info.get("ended_at")
        note = info.get("error") or ""
        if not note and "stack" in info:  # the hang watch read where the rank was
            from . import stacks  # only a hung run's records carry stacks

            note = stacks.where(stacks.frames_of(info["stack"]))
        return cls(rank, node_rank, host, exit_state(info), exit_code=info.get("exit_code"),
                   signal=info.get("signal"), started_at=started - clock_offset if started else None,
                   ended_at=ended - clock_offset if ended else time.time(), log_path=log_path,
                   note=note, stop_reason=info.get("stop_reason") or info.get("hung") or "",
                   nccl=info.get("nccl") if isinstance(info.get("nccl"), dict) else None)

    @classmethod
    def lost(cls, rank: int, node_rank: int, host: str, why: str, *, ended_at: Optional[float] = None,
             log_path: str = "") -> "RankResult":
        """A rank whose end nobody could record: its host went silent, or no exit status arrived."""
        return cls(rank, node_rank, host, RankState.LOST, ended_at=ended_at, log_path=log_path, note=why)

    @classmethod
    def from_record(cls, row: Mapping[str, Any], log_path: str = "") -> "RankResult":
        """A rank as the registry keeps it (a row of `ranks`, or an archived attempt's JSON: same keys)."""
        return cls(rank=row["rank"], node_rank=row["node_rank"], host=row["host"], state=RankState(row["state"]),
                   exit_code=row["exit_code"], signal=row["signal"], started_at=row["started_at"],
                   ended_at=row["ended_at"], log_path=log_path, note=row["note"] or "",
                   stop_reason=row["stop_reason"] or "")

    def to_json(self) -> dict:
        return {"rank": self.rank, "node_rank": self.node_rank, "host": self.host, "state": self.state.value,
                "exit_code": self.exit_code, "signal": self.signal, "started_at": self.started_at,
                "ended_at": self.ended_at, "note": self.note or None, "stop_reason": self.stop_reason or None,
                "result": self.describe()}

    @property
    def duration(self) -> Optional[float]:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)

    @property
    def hung(self) -> bool:
        """Stopped by the hang watch (job.hang_timeout); its note says where it was."""
        return self.stop_reason.startswith(HUNG)

    def describe(self, cause: Optional["RankResult"] = None) -> str:
        """How it ended, in words; cause: the run's root cause, to say that a rank ended because of it."""
        state = RankState(self.state)
        if state is RankState.LOST:
            return f"lost ({self.note})" if self.note else "lost"
        if state is RankState.STOPPED:
            return self._describe_stop(cause)
        # a rank that failed on its own is not said to have failed because of the root cause: ranks that
        # all lack torch fail within the same millisecond, and so does a rank whose peer's socket reset
        return how_it_ended(self.exit_code, self.signal, self.note) or state.value

    def _describe_stop(self, cause: Optional["RankResult"]) -> str:
        """Who stopped it and why (the stop reason its exit record carries), then how it ended."""
        if self.hung:
            return f"hung in {self.note}" if self.note else "hung"
        if self.note:
            return f"stopped: {self.note}"
        reason = self.stop_reason
        if reason == EndedBy.FAILURE.value or reason.startswith("failed elsewhere"):
            why = _after(cause) if cause is not None and cause.rank != self.rank \
                else " after " + (reason.split(": ", 1)[1] if ": " in reason else "another rank failed")
        else:
            why = _STOP_WHY.get(reason, f": {reason}" if reason else "")
        who = "its host" if reason.startswith("lost contact") else \
            "`clusterrun stop`" if reason == EndedBy.USER_STOP.value else "clusterrun"
        if self.signal:
            return f"stopped by {who}{why} ({signal_name(self.signal)})"
        if self.exit_code is not None:
            return f"stopped by {who}{why} (told to stop, it exited with code {self.exit_code})"
        return f"stopped by {who}{why}"


def _after(cause: "RankResult") -> str:
    """` after rank 2 on node2 failed`, or ` after node2 was lost` (the words the supervisors use for it)."""
    if RankState(cause.state) is RankState.LOST:
        return f" after {cause.host} was lost" + (f" ({cause.note})" if cause.note else "")
    return f" after rank {cause.rank} on {cause.host} failed"


@dataclass(frozen=True)
class AttemptSummary:
    """One attempt of a run that restarts: where it ran, how it ended, its first failure."""

    attempt: int
    hosts: Tuple[str, ...]
    world_size: int
    state: RunState
    reason: str
    dropped: Tuple[str, ...] = ()  # hosts of the attempt before that it went on without, with why


@dataclass(frozen=True)
class RunOutcome:
    """A run's end (or, detached, that it runs on): the one result type, made only in this module."""

    run_id: str
    state: RunState
    exit_code: int
    reason: str = ""
    root_cause: Optional[RankResult] = None
    ranks: Tuple[RankResult, ...] = ()
    cleanup_pending: Tuple[str, ...] = ()
    seconds: float = 0.0
    phases: Tuple[Tuple[str, float], ...] = field(default=())
    attempts: Tuple[AttemptSummary, ...] = ()  # job.restarts: every attempt, the last one included
    hint: str = ""  # what to change, from the root cause's last lines (hint_for)

    @property
    def failed(self) -> bool:
        """The run failed (a rank failed or was lost, or it could not start): what a restart follows."""
        return self.state is RunState.FAILED

    @property
    def hung(self) -> bool:
        """It failed because it hung (job.hang_timeout stopped it)."""
        return self.failed and self.reason.startswith(HUNG)


class EndedBy(str, Enum):
    """Why clusterrun itself ended a run, when it did."""

    INTERRUPT = "interrupted"  # Ctrl-C
    TIME_LIMIT = "time-limit"
    FAILURE = "failed"  # the first-failure teardown
    USER_STOP = "stopped"  # `clusterrun stop`


# a stopped rank's stop reason (its exit record's) → the words after "stopped by clusterrun"
_STOP_WHY = {EndedBy.INTERRUPT.value: " on Ctrl-C", EndedBy.TIME_LIMIT.value: " at the time limit",
             EndedBy.USER_STOP.value: ""}


def exit_state(info: Mapping) -> RankState:
    """A host's exit record of a rank → the rank's state."""
    if info.get("lost"):
        return RankState.LOST
    if info.get("exit_code") == 0:
        return RankState.SUCCEEDED
    if info.get("stopped"):
        return RankState.STOPPED
    return RankState.FAILED


# What a rank's last lines say → what the user should change (one line, under the root cause).
_HINTS = (
    (re.compile(r"unrecognized arguments:.*--(rank|world-size)"),
     "the script does not take --rank/--world-size: set job.rank_flags: false (it gets RANK, WORLD_SIZE, "
     "LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its environment), or launcher: torchrun"),
    (re.compile(r"arguments are required:.*--(rank|world-size)"),
     "the script wants --rank/--world-size: set job.rank_flags: true, or pass them in job.args with "
     "placeholders ({rank}, {world_size})"),
    # a script that reads sys.argv by position got clusterrun's --rank first (int(sys.argv[1]) on '--rank')
    (re.compile(r"'--(rank|world-size)'"),
     "the script reads its arguments by position (sys.argv[1], ...) and got --\\1 there: clusterrun puts "
     "`--rank i --world-size n` before job.args; set job.rank_flags: false (RANK and WORLD_SIZE are in its "
     "environment) and, where the script wants them, {rank} and {world_size} placeholders in job.args after "
     "its own arguments"),
    # torch's c10d store client when MASTER_ADDR says localhost (the DDP tutorial's setup()) on another host
    (re.compile(r"(?:failed to connect to|connect to) \[?(localhost|127\.0\.0\.1)\]?:(\d+)"),
     "the rank looked for rank 0 at \\1:\\2, its own host: the script sets MASTER_ADDR (or its init_method) "
     "itself, as the DDP tutorial's setup() does; clusterrun gives every rank MASTER_ADDR and MASTER_PORT: "
     "remove those lines, or use os.environ.setdefault(...)"),
    (re.compile(r"No module named '(torch)\b"),
     "the host's Python has no torch: set python: (under defaults:, or per host) to an interpreter that has "
     "it, such as a venv's bin/python, or install torch there; `clusterrun check INVENTORY` tests every host"),
    (re.compile(r"No module named '([\w.]+)'"),
     "the host's Python lacks the module \\1: install it there (job.setup can: `$CLUSTERRUN_PYTHON -m pip "
     "install ...`), or set python: to an interpreter that has it"),
    (re.compile(r"EADDRINUSE|[Aa]ddress already in use"),
     "something already listens on the master port on rank 0's host (another run still going? `clusterrun "
     "ps`); master: {port: auto} takes a free port"),
)
# torch (2.13, gloo) aborts in its exit handlers, in about a third of multi-host runs, when a script ends
# without destroying its process group: the rank printed its last lines, then this, then SIGABRT.
_ABORT_AT_EXIT = "terminate called without an active exception"
_ABORT_HINT = ("the rank ended its work and aborted at exit (SIGABRT, \"terminate called without an active "
               "exception\"): torch's process group was still up when Python exited; call "
               "torch.distributed.destroy_process_group() at the end of the script")
# A collective that timed out: torch's NCCL watchdog, gloo's transport.
_NCCL_TIMEOUT = re.compile(r"WorkNCCL\((?=[^)]*OpType=(\w+))(?=[^)]*Timeout\(ms\)=(\d+))(?:[^)]*SeqNum=(\d+))?")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation")
_GLOO_CLOSED = re.compile(r"Connection closed by peer \[?([0-9a-fA-F.:]+)\]?:(\d+)")
_COLLECTIVE = re.compile(r"\bin (all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|reduce|gather|"
                         r"scatter|all_to_all\w*|send|recv|isend|irecv|monitored_barrier|wait)\b")
_MISSING = ("a rank never joined it (stopped, or stuck before the collective): `clusterrun stacks RUN` "
            "while it hangs shows which; job.hang_timeout catches it sooner")


def _collective_hint(text: str) -> str:
    """Which collective timed out and after how long, from NCCL's or gloo's own words ("" if neither)."""
    m = _NCCL_TIMEOUT.search(text)
    if m:
        seq = f" (SeqNum {m.group(3)})" if m.group(3) else ""
        return f"NCCL {m.group(1)}{seq} timed out after {int(m.group(2)) / 1000:g} s: {_MISSING}"
    m = _GLOO_TIMEOUT.search(text)
    if m:
        called = _COLLECTIVE.findall(text)
        what = f"gloo {called[-1]}" if called else "a gloo collective"
        return f"{what} timed out after {int(m.group(1)) / 1000:g} s waiting for a {m.group(2)}: {_MISSING}"
    m = _GLOO_CLOSED.search(text)
    if m:
        return (f"gloo: the peer at {m.group(1)}:{m.group(2)} closed its connection: the rank there ended first "
                "(its own failure is the cause; see the other failed ranks)")
    return ""


# A rank that could not connect to a peer at the address the peer offered: gloo's "remote=[ADDR]:PORT"
# (also "Connect timeout [ADDR]:PORT"), NCCL's "Connect to ADDR<PORT> failed".
_GLOO_PEER = re.compile(r"(?:remote=|[Cc]onnect timeout |connect )\[([0-9A-Fa-f.:%]+)\]:(\d+)")
_NCCL_PEER = re.compile(r"Connect to \[?([0-9A-Fa-f.:%]+?)\]?<(\d+)>")
_IFNAME_FIX = ("network.ifname: auto (the default: clusterrun sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME "
               "to the interface that leads to rank 0's addr) or network.ifname: NAME")

Addresses = Mapping[str, Tuple[str, str]]  # address → (host, "addr" | "chosen" | the interface holding it)


def hint_for(result: RankResult, addresses: Optional[Addresses] = None) -> str:
    """A hint for the root cause, from the rank's last log lines ("" when none applies). addresses: what
    the run knows of its hosts' addresses (plan.known_addresses), to say whose an address is. A hint may
    name INVENTORY, for the one who shows it to replace."""
    text = "\n".join(result.tail)
    if result.signal == _signal.SIGABRT and _ABORT_AT_EXIT in text:
        return _ABORT_HINT
    for pattern, hint in _HINTS:
        found = pattern.search(text)
        if found:
            return found.expand(hint)
    return network_hint(result, text, addresses or {}) or _collective_hint(text)


def _peer_address(text: str) -> Optional[Tuple[str, str]]:
    """(address, port) of the last gloo or NCCL connection failure in text."""
    found = None
    for line in text.splitlines():
        lower = line.lower()
        pattern = _GLOO_PEER if "gloo" in lower or "pair.cc" in lower else _NCCL_PEER if "nccl" in lower else None
        match = pattern.search(line) if pattern else None
        if match:
            found = (match.group(1), match.group(2))
    return found


def network_hint(result: RankResult, text: str, addresses: Addresses) -> str:
    """A rank that could not reach a peer at a loopback address, an address no host of the run has, or
    one on an interface the others cannot use: whose address it is, and the fix. "" for an address that
    is a host's own (a peer that died or a firewall: not an interface problem)."""
    found = _peer_address(text)
    if found is None:
        return ""
    addr, port = found
    who = f"rank {result.rank} on {result.host} could not connect to {addr}:{port}"
    try:
        loopback = ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return ""
    if loopback:
        return (f"{who}, a loopback address (on {result.host} it is {result.host} itself): the peer's own name "
                "resolves to it (Debian and Ubuntu put a host's name on 127.0.1.1 in /etc/hosts), so torch "
                f"offered it to the others. Fix: {_IFNAME_FIX}, or map each host's name to its network address "
                "in /etc/hosts")
    host, where = addresses.get(addr, ("", ""))
    if not host:
        return (f"{who}, which is no address of any host of this run: a peer offered an address the others "
                f"cannot use (its name resolves to a stale or foreign address). Fix: {_IFNAME_FIX}, or correct "
                "the host's name in /etc/hosts (or DNS)")
    if where in ("addr", "chosen"):
        return ""
    return (f"{who}, {host}'s address on {where}, not on the interface the other hosts reach {host} by. "
            f"Fix: {_IFNAME_FIX} for {host}")




def root_cause(ranks: Sequence[RankResult]) -> Optional[RankResult]:
    failures = sorted((r for r in ranks if RankState(r.state).failed),
                      key=lambda r: (r.ended_at if r.ended_at is not None else float("inf"), r.rank))
    return failures[0] if failures else None


def _ended_by(ranks: Sequence[RankResult], ended_by: Optional[EndedBy]) -> Optional[EndedBy]:
    """The supervisors enforce the time limit themselves: with no controller there, the ranks say so."""
    if ended_by is None and all(RankState(r.state).terminal for r in ranks) and \
            any(r.stop_reason == EndedBy.TIME_LIMIT.value for r in ranks):
        return EndedBy.TIME_LIMIT
    return ended_by


def decide(run_id: str, ranks: Sequence[RankResult], *, ended_by: Optional[EndedBy] = None,
           time_limit: Optional[float] = None, stop_note: str = "",
           addresses: Optional[Addresses] = None) -> Optional[RunOutcome]:
    """The run's end from its ranks, or None while a rank may still run and nothing forces the end.

    ended_by: why clusterrun ended the run, if it did. stop_note: what to say when the ranks were
    stopped without failing (the reason the registry holds, if any). addresses: the hosts' addresses,
    for the root cause's hint (hint_for)."""
    result = _decide(run_id, tuple(ranks), ended_by, time_limit, stop_note)
    if result is None or result.root_cause is None:
        return result
    return replace(result, hint=hint_for(result.root_cause, addresses))


def _decide(run_id: str, ranks: Tuple[RankResult, ...], ended_by: Optional[EndedBy], time_limit: Optional[float],
            stop_note: str) -> Optional[RunOutcome]:
    root = root_cause(ranks)
    ended_by = _ended_by(ranks, ended_by)
    if ended_by is EndedBy.INTERRUPT:
        return _end(run_id, RunState.INTERRUPTED, INTERRUPTED, root, ranks)
    if ended_by is EndedBy.TIME_LIMIT:
        return _end(run_id, RunState.TIMED_OUT, time_limit_reached(time_limit), root, ranks)
    states = [RankState(r.state) for r in ranks]
    if ended_by is not None or all(s.terminal for s in states):
        hung = _hung(run_id, ranks)  # first: a rank that died once its hung peers were stopped is no cause
        if hung is not None:
            return hung
    if root is not None and (ended_by is not None or all(s.terminal for s in states)):
        return _end(run_id, RunState.FAILED, rank_failed(root.rank, root.host, root.describe()), root, ranks)
    if not all(s.terminal for s in states):
        return None
    return _ended_without_failure(run_id, states, ranks, stop_note)


def _hung(run_id: str, ranks: Tuple[RankResult, ...]) -> Optional[RunOutcome]:
    """The supervisors stopped the run as hung (job.hang_timeout): it failed; the root cause is the odd
    rank (the smallest group of ranks that were in the same place), and the reason names every group."""
    hung = [r for r in ranks if r.hung]
    if not hung:
        return None
    from . import stacks

    cause = stacks.hang_cause([(r.rank, r.host, r.note) for r in hung])
    behind = behind_text({r.rank: r.nccl for r in hung if r.nccl}, {r.rank: r.host for r in hung})
    groups = {}
    for r in hung:
        groups.setdefault(r.note, []).append(r)
    odd = min(groups.values(), key=lambda g: (len(g), g[0].rank))[0]
    if behind:  # NCCL's own account names the rank behind: it is the root cause
        lowest = min((r for r in hung if r.nccl), key=lambda r: (r.nccl["seq"], r.rank))
        odd = lowest if lowest.nccl["seq"] < max(r.nccl["seq"] for r in hung if r.nccl) else odd
        cause = f"NCCL: {behind}; stacks: {cause}"
    return _end(run_id, RunState.FAILED, f"{hung[0].stop_reason}; {cause}", odd, ranks)


def _ended_without_failure(run_id: str, states: Sequence[RankState], ranks: Tuple[RankResult, ...],
                           stop_note: str) -> RunOutcome:
    """Every rank ended and none failed: the job succeeded, or its ranks were stopped (or never started)."""
    if all(s is RankState.SUCCEEDED for s in states):
        return _end(run_id, RunState.SUCCEEDED, "", None, ranks)
    if RankState.NOT_STARTED in states:
        return _end(run_id, RunState.FAILED, stop_note or "the controller ended before every rank started", None,
                    ranks)
    return _end(run_id, RunState.STOPPED, stop_note or "stopped before the job finished (clusterrun stop?)", None,
                ranks)


def reconciled(run_id: str, ranks: Sequence[RankResult], *, stop_note: str = "") -> Optional[RunOutcome]:
    """`ps`'s verdict on a run whose controller is gone, from what its hosts said: as `decide`, except
    that a controller that died while starting (some hosts never started, others run) ends the run
    now: what did start waits for peers that never come."""
    never = sorted({r.host for r in ranks if r.state is RankState.NOT_STARTED})
    running = [r for r in ranks if not r.state.terminal]
    if never and running:
        return _end(run_id, RunState.FAILED, f"the controller ended before {', '.join(never)} started; "
                                             f"`clusterrun stop {run_id}` ends the ranks that did start",
                    None, tuple(ranks))
    return decide(run_id, ranks, stop_note=stop_note)


def after_stop(run_id: str, ranks: Sequence[RankResult], *, stop_note: str = "") -> RunOutcome:
    """`clusterrun stop` reached every host: the ranks' end, or stopped (an exit that never got recorded)."""
    return decide(run_id, ranks, stop_note=stop_note) or _end(
        run_id, RunState.STOPPED, stop_note or "stopped by `clusterrun stop`", None, tuple(ranks))


def _end(run_id: str, state: RunState, reason: str, root: Optional[RankResult],
         ranks: Tuple[RankResult, ...]) -> RunOutcome:
    code = EXIT_FAILED if state is RunState.FAILED else state.exit_code
    return RunOutcome(run_id, state, code, reason, root_cause=root, ranks=ranks)


def interrupted(run_id: str, why: str = INTERRUPTED) -> RunOutcome:
    """Ctrl-C before the ranks ran (while connecting, pushing, starting, or waiting to restart)."""
    return RunOutcome(run_id, RunState.INTERRUPTED, RunState.INTERRUPTED.exit_code, why)


def launch_failed(run_id: str, exc: ClusterrunError) -> RunOutcome:
    """The launch could not get the ranks running (hosts failed, a job file went missing)."""
    return RunOutcome(run_id, RunState.FAILED, exc.exit_code, str(exc))


def detached(run_id: str) -> RunOutcome:
    """launch --detach: the run goes on without this controller (not an end)."""
    return RunOutcome(run_id, RunState.RUNNING, 0, "detached")


def queued(run_id: str) -> RunOutcome:
    """launch --detach --wait with a host busy: the run waits on its hosts for its turn (not an end)."""
    return RunOutcome(run_id, RunState.WAITING, 0, "waiting on its hosts for its turn")


def attempt_not_started(run_id: str, ranks: Sequence[Any], exc: HostsFailed) -> RunOutcome:
    """An attempt that could not start on some hosts (ranks: its RankSpecs): those hosts count as lost
    (the next attempt goes on without them), the ranks elsewhere as stopped."""
    failed = set(exc.failures)
    results = tuple(RankResult.lost(r.rank, r.node_rank, r.host_name,
                                    f"could not start: {exc.failures[r.host_name].message}")
                    if r.host_name in failed else
                    RankResult(r.rank, r.node_rank, r.host_name, RankState.STOPPED,
                               note="its attempt did not start everywhere") for r in ranks)
    return replace(launch_failed(run_id, exc), ranks=results)


def recorded(run_id: str, state: RunState, exit_code: Optional[int], reason: str, ranks: Sequence[RankResult], *,
             cleanup_pending: Sequence[str] = (), seconds: float = 0.0,
             attempts: Sequence[AttemptSummary] = ()) -> RunOutcome:
    """A run's end as the registry keeps it (`logs -f` of a run launched elsewhere or detached): the verdict
    made when it ended, the root cause found again from its ranks (the failed ones with their last lines)."""
    ranks = tuple(ranks)
    return RunOutcome(run_id, state, state.exit_code if exit_code is None else exit_code, reason,
                      root_cause=root_cause(ranks), ranks=ranks, cleanup_pending=tuple(cleanup_pending),
                      seconds=seconds, attempts=tuple(attempts) if len(attempts) > 1 else ())


def with_attempts(outcome: RunOutcome, attempts: Sequence[AttemptSummary]) -> RunOutcome:
    """The run's outcome is its last attempt's, listing every attempt (none when there was only one)."""
    return replace(outcome, attempts=tuple(attempts) if len(attempts) > 1 else ())
