"""A run's stacks, folded (pure): where each rank is, and identical stacks as one group (as `dshbak -c`
folds identical outputs), the smallest group first, so the odd rank is named on the first line.

The words are the same everywhere: `clusterrun stacks` prints these groups, and a hung run's root cause
(outcome.py) folds the ranks by `where` each one was when the hang watch took its stack:
`rank 2 on node2 in slow_loader (job.py:12); ranks 0-1,3 in all_reduce`.

Frames come innermost first (as py-spy and faulthandler list them). A frame is the job's own when its
file is under a run's pushed job folder (`.../runs/RUN/job/`): those are shown relative to it; others by
their path inside site-packages (`torch/distributed/distributed_c10d.py`) or the standard library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

JOB_FILE = re.compile(r"/runs/[^/]+/job/(.+)$")
LIBRARY = (re.compile(r"/(?:site|dist)-packages/(.+)$"), re.compile(r"/lib/python\d+(?:\.\d+)?/(.+)$"))
NO_STACK = "no stack"


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def to_json(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class ThreadStack:
    name: str
    ident: str
    main: bool
    frames: Tuple[Frame, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "id": self.ident, "main": self.main, "frames": [f.to_json() for f in self.frames]}


@dataclass(frozen=True)
class ProcessStack:
    """A process a rank started (a DataLoader worker, an mp.spawn child)."""

    pid: int
    name: str
    via: str
    threads: Tuple[ThreadStack, ...]
    error: str = ""

    def to_json(self) -> dict:
        return {"pid": self.pid, "name": self.name, "via": self.via, "threads": [t.to_json() for t in self.threads],
                "error": self.error or None}


@dataclass(frozen=True)
class RankStack:
    """One rank's stacks as its host read them: every thread, and the processes it started."""

    rank: int
    host: str
    pid: Any  # int, or None when the rank does not run
    state: str  # running | ended | not-started
    via: str  # py-spy | faulthandler | "" (none could be read)
    threads: Tuple[ThreadStack, ...] = ()
    children: Tuple[ProcessStack, ...] = ()
    error: str = ""

    @property
    def main_frames(self) -> Tuple[Frame, ...]:
        return next((t.frames for t in self.threads if t.main), ())

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "pid": self.pid, "state": self.state, "via": self.via or None,
                "threads": [t.to_json() for t in self.threads], "children": [c.to_json() for c in self.children],
                "error": self.error or None}


@dataclass(frozen=True)
class Group:
    """Ranks whose main threads have the same stack (or that share a state with no stack)."""

    ranks: Tuple[int, ...]
    hosts: Tuple[str, ...]  # in rank order, each once
    frames: Tuple[Frame, ...]
    status: str = ""  # why there are no frames ("ended", "no stack: ..."); "" when there are

    def to_json(self) -> dict:
        return {"ranks": list(self.ranks), "hosts": list(self.hosts), "frames": [f.to_json() for f in self.frames],
                "where": self.where, **({"status": self.status} if self.status else {})}

    @property
    def where(self) -> str:
        return where(self.frames) if self.frames else self.status


# -------------------------------------------------------------- reading a host's answer


def _frames(raw: Any) -> Tuple[Frame, ...]:
    return tuple(Frame(str(f.get("function", "?")), str(f.get("file", "?")), _int(f.get("line")))
                 for f in raw or () if isinstance(f, Mapping))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _threads(raw: Any) -> Tuple[ThreadStack, ...]:
    return tuple(ThreadStack(str(t.get("name") or "?"), str(t.get("id") or ""), bool(t.get("main")), _frames(t.get("frames")))
                 for t in raw or () if isinstance(t, Mapping))


def from_host(host: str, answer: Mapping[str, Any]) -> List[RankStack]:
    """A host's `stacks` answer (remote/host/observe/stacks.py) as records; anything malformed is left out."""
    out = []
    for r in answer.get("ranks") or ():
        if not isinstance(r, Mapping) or not isinstance(r.get("rank"), int):
            continue
        children = tuple(ProcessStack(_int(c.get("pid")), str(c.get("name") or ""), str(c.get("via") or ""),
                                      _threads(c.get("threads")), str(c.get("error") or ""))
                         for c in r.get("children") or () if isinstance(c, Mapping))
        out.append(RankStack(r["rank"], host, r.get("pid"), str(r.get("state") or "running"), str(r.get("via") or ""),
                             _threads(r.get("threads")), children, str(r.get("error") or "")))
    return out


def frames_of(raw: Any) -> Tuple[Frame, ...]:
    """Frames from their JSON form (an exit record's "stack")."""
    return _frames(raw)


# -------------------------------------------------------------- words


def is_job_file(path: str) -> bool:
    return JOB_FILE.search(path) is not None


def short_path(path: str) -> str:
    """A frame's file as a person reads it: relative to the job folder, or inside site-packages/stdlib."""
    for pattern in (JOB_FILE,) + LIBRARY:
        m = pattern.search(path)
        if m:
            return m.group(1)
    return path.rsplit("/", 1)[-1]


def location(frame: Frame) -> str:
    return f"{frame.function} ({short_path(frame.file)}:{frame.line})"


def where(frames: Sequence[Frame]) -> str:
    """Where a stack is: its innermost frame, and the job's own frame that led there
    (`all_reduce < train_step (train.py:88)`); a stack all in the job: `slow_loader (job.py:12)`."""
    if not frames:
        return NO_STACK
    inner = frames[0]
    if is_job_file(inner.file):
        return location(inner)
    own = next((f for f in frames if is_job_file(f.file)), None)
    return f"{inner.function} < {location(own)}" if own is not None else location(inner)


def innermost(where_text: str) -> str:
    """The function a `where` names first: `all_reduce < train_step (train.py:88)` → `all_reduce`."""
    return where_text.split(" < ", 1)[0].split(" (", 1)[0]


def rank_ranges(ranks: Sequence[int]) -> str:
    """0,1,3,4,5 → 0-1,3-5."""
    spans: List[List[int]] = []
    for r in sorted(set(ranks)):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def ranks_label(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


# -------------------------------------------------------------- folding


def _key(stack: RankStack) -> Tuple[Any, ...]:
    if stack.state != "running":
        return ("state", f"{stack.state}: {stack.error}" if stack.error else stack.state)
    frames = stack.main_frames
    if not frames:
        return ("error", f"{NO_STACK}: {stack.error}" if stack.error else NO_STACK)
    # by the path a person reads: the job folder differs from host to host (each its own workdir)
    return ("frames",) + tuple((f.function, short_path(f.file), f.line) for f in frames)


def fold(stacks: Sequence[RankStack]) -> List[Group]:
    """Ranks with identical main-thread stacks together; the smallest group first (ties: lowest rank)."""
    groups: Dict[Tuple[Any, ...], List[RankStack]] = {}
    for s in sorted(stacks, key=lambda s: s.rank):
        groups.setdefault(_key(s), []).append(s)
    out = []
    for key, members in groups.items():
        hosts = tuple(dict.fromkeys(m.host for m in members))
        status = "" if key[0] == "frames" else str(key[1])
        out.append(Group(tuple(m.rank for m in members), hosts, members[0].main_frames if not status else (), status))
    return sorted(out, key=lambda g: (len(g.ranks), g.ranks[0]))


def headline(group: Group, world: int) -> str:
    """`rank 2 (1 of 4) on node2: slow_loader (job.py:12)`; the hosts are named when there is one."""
    on = f" on {group.hosts[0]}" if len(group.hosts) == 1 else ""
    return f"{ranks_label(group.ranks)} ({len(group.ranks)} of {world}){on}: {group.where}"


def hang_cause(ranks: Sequence[Tuple[int, str, str]]) -> str:
    """The hang's root cause from (rank, host, where) of every rank the hang watch read: the smallest
    group in full, the others by their innermost function
    (`rank 2 on node2 in slow_loader (job.py:12); ranks 0-1,3 in all_reduce`)."""
    groups: Dict[str, List[Tuple[int, str]]] = {}
    for rank, host, text in sorted(ranks):
        groups.setdefault(text or NO_STACK, []).append((rank, host))
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][0][0]))
    parts = []
    for i, (text, members) in enumerate(ordered):
        label = ranks_label([r for r, _ in members])
        hosts = {h for _, h in members}
        on = f" on {next(iter(hosts))}" if i == 0 and len(hosts) == 1 else ""
        parts.append(f"{label}{on} in {text if i == 0 else innermost(text)}")
    return "; ".join(parts)


def to_json(run_id: str, stacks: Sequence[RankStack], groups: Sequence[Group],
            unreachable: Mapping[str, str]) -> dict:
    """`clusterrun stacks --json`."""
    return {"run": run_id, "ranks": [s.to_json() for s in sorted(stacks, key=lambda s: s.rank)],
            "groups": [g.to_json() for g in groups], "unreachable": dict(unreachable)}
