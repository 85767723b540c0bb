"""Placeholders in `job.args` and `env:` values, rendered per rank: `--rank {rank}`, `{dist_url}`.

Only `{name}` with a lowercase identifier inside is a placeholder; every other brace passes through as
it is (a JSON argument such as `{"lr": 0.1}`, even nested). `{{` is a literal `{`, and the `}}` that
closes it a literal `}`: `{{rank}}` renders as the text `{rank}`. Pure.
"""

from __future__ import annotations

import difflib
import re
from typing import List, Mapping, Optional

NAMES = ("rank", "local_rank", "world_size", "node_rank", "nnodes", "nproc_per_node", "master_addr", "master_port",
         "dist_url", "run_id", "attempt")
PER_WORKER = ("rank", "local_rank")  # what differs between the workers of one host

_TOKEN = re.compile(r"\{\{|\}\}|\{([a-z_][a-z0-9_]*)\}")


def names_in(text: str) -> List[str]:
    """The placeholder names a value uses (known or not), in order."""
    return [m.group(1) for m in _TOKEN.finditer(text) if m.group(1)]


def unknown_problem(name: str) -> str:
    close = difflib.get_close_matches(name, NAMES, n=1)
    hint = f"; did you mean {{{close[0]}}}?" if close else ""
    return (f"unknown placeholder {{{name}}}{hint} (known: {', '.join('{' + n + '}' for n in NAMES)}; "
            "write {{ and }} for literal braces)")


def check(text: str, *, per_worker_ok: bool = True) -> Optional[str]:
    """Why this value cannot be rendered (an unknown name, or a per-worker one where workers share argv)."""
    for name in names_in(text):
        if name not in NAMES:
            return unknown_problem(name)
        if name in PER_WORKER and not per_worker_ok:
            return (f"{{{name}}} cannot be rendered with launcher: torchrun (every worker of a host gets the same "
                    f"arguments); the script reads {name.upper()} from its environment")
    return None


def render(text: str, values: Mapping[str, object]) -> str:
    """The value with every placeholder replaced; unknown names are left as they are (check() first)."""
    if "{" not in text and "}" not in text:
        return text
    out: List[str] = []
    escapes = 0  # `{{` still waiting for the `}}` that closes it
    pos = 0
    for m in _TOKEN.finditer(text):
        out.append(text[pos:m.start()])
        token = m.group(0)
        if token == "{{":
            out.append("{")
            escapes += 1
        elif token == "}}":
            if escapes:
                out.append("}")
                escapes -= 1
            else:
                out.append("}}")
        elif m.group(1) in values:
            out.append(str(values[m.group(1)]))
        else:
            out.append(token)
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)
