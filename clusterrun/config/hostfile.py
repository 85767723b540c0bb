"""DeepSpeed/OpenMPI hostfiles (`node1 slots=4`, `#` comments): the host list of an inventory."""

from __future__ import annotations

import re
from typing import List, Tuple

from ..errors import InventoryError, Problem

HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_\[][A-Za-z0-9._:%\[\]-]{0,252}$")


def parse_hostfile(text: str, file: str) -> List[Tuple[dict, str]]:
    """DeepSpeed/OpenMPI hostfile lines (`node1 slots=4`, `#` comments) → host settings with their source."""
    problems: List[Problem] = []
    hosts: List[Tuple[dict, str]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0]
        words = line.split()
        if not words:
            continue
        col = raw.index(words[0]) + 1
        if not HOSTNAME_RE.match(words[0]):
            problems.append(Problem(file, lineno, col, "", f"{words[0]!r} is not a valid host name"))
            continue
        settings: dict = {"host": words[0]}
        for word in words[1:]:
            m = re.match(r"^(slots|max_slots|max-slots)=(\d+)$", word)
            wcol = raw.index(word) + 1
            if not m:
                problems.append(Problem(file, lineno, wcol, "", f"unexpected {word!r}; expected slots=N"))
            elif m.group(1) == "slots":
                if int(m.group(2)) < 1:
                    problems.append(Problem(file, lineno, wcol, "", "slots must be at least 1"))
                settings["slots"] = max(1, int(m.group(2)))
        hosts.append((settings, f"{file}:{lineno}:{col}"))
    if problems:
        raise InventoryError(problems)
    if not hosts:
        raise InventoryError([Problem(file, 1, 1, "", "the hostfile lists no hosts")])
    return hosts


def looks_like_hostfile(text: str) -> bool:
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    return bool(lines) and all(":" not in ln and not ln.startswith("-") for ln in lines)
