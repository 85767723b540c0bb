"""Folding the live view (pure): the same line from many ranks at about the same time shown once, with the
set of ranks that printed it (`[node[0-7] r*] warning ...`, `[node[1-2] r4-11] loading weights`); a line
only some ranks printed is shown with just their set, a line of one rank exactly as without folding.

The notation is pdsh's and ClusterShell's node sets: hosts folded by their numeric suffix
(`node[0-3,5]`), ranks as ranges (`r0-12,14-31`), `r*` for every rank of the run.

How a line is held: each line goes into a group of identical lines (same text, same stream) that this
source (a host's rank, or a host's other output) is not in yet; a group is shown `window` seconds after
its first line came, so no line waits longer than that. Groups are shown in the order they began, and a
source joins a group only where that keeps its own lines in order; the one exception is a source whose
lines after that group are its own alone (rank 3 printed a line of its own, then the line every rank
printed): those move up before the group, as they concern no other rank. A flood is held to `max_held`
lines: past that, the oldest groups are shown at once.

Time is given, not read: a live view passes the clock, a recorded run's replay the line number.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Deque, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..stacks import rank_ranges

FOLD_AT = 16  # ranks: a launch (or sweep) of this many or more folds by default
WINDOW_S = 0.15  # how long a line waits for its twins; the run's loop looks every 50 ms: at most 200 ms
REPLAY_WINDOW = 64  # lines: `logs --fold` folds a line with its twins at most this far into the other logs
MAX_HELD = 20000  # lines held at once (a flood past it is shown without waiting)
MAX_MOVED = 64  # a source's own lines moved up before a group, at most (a longer run of them: not folded)

Source = Tuple[str, Optional[int], str]  # (host, rank or None for a host's other output, stream)


def fold_wanted(option: Optional[bool], ranks: int) -> bool:
    """--fold / --no-fold when given, else on from FOLD_AT ranks."""
    return option if option is not None else ranks >= FOLD_AT


class _Group:
    """Held lines alike: one made per distinct line of a flood, so a plain class with slots (a dataclass's
    default_factory cost a flood of 16 ranks' lines a third of its time here)."""

    __slots__ = ("key", "at", "seq", "members")

    def __init__(self, key: Tuple[str, bytes], at: float, seq: float):
        self.key = key  # (stream, line)
        self.at = at  # when its first line came (or the group it moved up before: so the order stays by time)
        self.seq = seq  # its place in the order shown
        self.members: Dict[Source, None] = {}  # in the order they joined


class Folded(NamedTuple):
    """Lines to show under one prefix: several lines of one source, or one line of several."""

    sources: Tuple[Source, ...]
    data: bytes


class Folder:
    """Holds lines for up to `window` and hands them back folded (see the module's docstring)."""

    def __init__(self, window: float = WINDOW_S, max_held: int = MAX_HELD):
        self.window = window
        self.max_held = max_held
        self._pending: Deque[_Group] = deque()  # in the order shown, `at` never decreasing
        self._by_key: Dict[Tuple[str, bytes], List[_Group]] = {}
        self._own: Dict[Source, Deque[_Group]] = {}  # each source's held groups, in order
        self._held = 0
        self._seq = 0

    @property
    def held(self) -> int:
        """Lines held now."""
        return self._held

    def add(self, source: Source, data: bytes, now: float) -> List[Folded]:
        """Whole lines of one source, held; what must be shown now to hold no more than max_held lines (the
        oldest). What has waited its window is shown by the next `due` (the run's loop calls it every 50 ms):
        one batch then, not a release with every line (a flood of distinct lines paid it per line)."""
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end + 1
            self._place(source, data[start:end], now)
            start = end
        return self._release(lambda g: self._held > self.max_held) if self._held > self.max_held else []

    def due(self, now: float) -> List[Folded]:
        """What has waited its window by now."""
        return self._release(lambda g: g.at <= now - self.window)

    def flush(self) -> List[Folded]:
        """Everything held (the run's end)."""
        return self._release(lambda g: True)

    # -------------------------------------------------------------- placing a line

    def _place(self, source: Source, line: bytes, now: float) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"
        key = (source[2], line)
        own = self._own.get(source)
        last = own[-1] if own else None
        group = self._joinable(source, key, last, now - self.window)
        if group is None:
            self._seq += 1
            group = _Group(key, now, float(self._seq))
            self._pending.append(group)
            self._by_key.setdefault(key, []).append(group)
        group.members[source] = None
        self._own.setdefault(source, deque()).append(group)
        self._held += 1

    def _joinable(self, source: Source, key: Tuple[str, bytes], last: Optional[_Group],
                  stale: float) -> Optional[_Group]:
        """The oldest held group of this line that the source may join, if any: not one that began at or
        before `stale` (it has waited its window: the same line now is a new one, shown again)."""
        groups = self._by_key.get(key)
        if not groups:
            return None
        if last is None:
            return next((g for g in groups if source not in g.members and g.at > stale), None)
        found = None
        looked = 0
        for g in reversed(groups):  # those after the source's last group cannot hold it yet
            if g.at <= stale:
                continue
            if g.seq > last.seq:
                found = g
                continue
            if found is not None or looked >= MAX_MOVED:
                break
            looked += 1
            if source not in g.members and self._move_up_before(source, g):
                return g
        return found

    def _move_up_before(self, source: Source, group: _Group) -> bool:
        """Move the source's groups after `group` before it, when they hold that source alone."""
        own = self._own[source]
        after: List[_Group] = []
        for g in reversed(own):
            if g.seq < group.seq:
                break
            if len(g.members) != 1 or len(after) >= MAX_MOVED:
                return False
            after.append(g)
        after.reverse()
        for g in after:
            self._pending.remove(g)
        place = self._pending.index(group)
        before = self._pending[place - 1].seq if place else group.seq - 1.0
        for i, g in enumerate(after):
            g.seq = before + (group.seq - before) * (i + 1) / (len(after) + 1)
            g.at = group.at
            self._pending.insert(place + i, g)
        return True

    # -------------------------------------------------------------- showing

    def _release(self, ready) -> List[Folded]:
        runs: List[Tuple[Tuple[Source, ...], List[bytes]]] = []  # joined once at the end: a run of one
        # source's lines grown a line at a time by bytes + bytes was quadratic (a flood: ~20 µs a line)
        while self._pending and ready(self._pending[0]):
            group = self._pending.popleft()
            same = self._by_key[group.key]
            same.remove(group)
            if not same:
                del self._by_key[group.key]
            for source in group.members:
                own = self._own[source]
                own.popleft()
                if not own:
                    del self._own[source]
            self._held -= len(group.members)
            sources = tuple(group.members)
            if len(sources) == 1 and runs and runs[-1][0] == sources:  # a run of one source's lines
                runs[-1][1].append(group.key[1])
            else:
                runs.append((sources, [group.key[1]]))
        return [Folded(sources, b"".join(lines)) for sources, lines in runs]


# -------------------------------------------------------------- the prefix


def host_ranges(names: Sequence[str]) -> str:
    """node0,node1,node2,gpu1 → node[0-2],gpu1 (pdsh's and dshbak's notation), in the order first seen.
    Zero-padded numbers (node01) are left as they are: folding them would change the names."""
    numbered: Dict[str, list] = {}
    order: list = []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m and (m.group(2) == "0" or not m.group(2).startswith("0")):
            key = ("n", m.group(1))
            numbered.setdefault(m.group(1), []).append(int(m.group(2)))
        else:
            key = ("x", name)
        if key not in order:
            order.append(key)
    parts = []
    for kind, value in order:
        if kind == "x":
            parts.append(value)
            continue
        numbers = sorted(set(numbered[value]))
        text = rank_ranges(numbers)
        parts.append(f"{value}{text}" if len(numbers) == 1 else f"{value}[{text}]")
    return ",".join(parts)


def group_label(sources: Iterable[Source], world: Optional[int] = None) -> str:
    """`node[0-7] r*`, `node[1-2] r4-11`, `node[1-4] torchrun`: what goes between the brackets.

    world: the run's number of ranks, so that a line every rank printed reads `r*`."""
    sources = sorted(sources, key=lambda s: (s[1] is None, s[1] if s[1] is not None else 0))
    hosts = host_ranges(list(dict.fromkeys(s[0] for s in sources)))
    ranks = [s[1] for s in sources if s[1] is not None]
    if ranks:
        every = world is not None and len(ranks) > 1 and set(ranks) == set(range(world))
        return f"{hosts} r{'*' if every else rank_ranges(ranks)}"
    stream = sources[0][2]
    return f"{hosts} {stream}" if stream else hosts


# -------------------------------------------------------------- a run's end


def fold_results(rows: Iterable[Tuple[int, str, str, Optional[float]]]) -> List[Tuple[str, str, str, str]]:
    """The closing summary folded: rows (rank, host, result, seconds) as one row per result, in the order of
    each result's lowest rank: its ranks (`0-30 (31)`), their hosts (`node[0-30]`), the result, and the
    durations (one, or their range `1.0–9.9 s`). A rank that ended its own way keeps a row of its own."""
    groups: Dict[str, list] = {}
    for rank, host, result, seconds in sorted(rows, key=lambda r: r[0]):
        groups.setdefault(result, []).append((rank, host, seconds))
    out = []
    for result, members in groups.items():
        ranks = [m[0] for m in members]
        times = [m[2] for m in members if m[2] is not None]
        low, high = (f"{min(times):.1f}", f"{max(times):.1f}") if times else ("-", "-")
        out.append((rank_ranges(ranks) + (f" ({len(ranks)})" if len(ranks) > 1 else ""),
                    host_ranges(list(dict.fromkeys(m[1] for m in members))), result,
                    "-" if not times else f"{low} s" if low == high else f"{low}–{high} s"))
    return out
