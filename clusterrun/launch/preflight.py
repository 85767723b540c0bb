"""Launch's preflight: the cheap part of `clusterrun check`, from facts the hosts report while the job
is pushed (no extra round trip, no torch import): Python runs and has the same minor version everywhere,
and rank 0's fixed master port is free. The push itself checks that the job fits on each host's disk.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

from ..check.rules import FAIL, WARN, CheckProblem, port_text, python_results
from ..errors import HostError, HostsFailed, PreflightError
from ..config.inventory import Inventory


def preflight(inv: Inventory, facts: Mapping[int, Mapping]) -> List[CheckProblem]:
    """Warnings and failures, ordered by node rank; facts: node rank → what its push reported."""
    names = {i: h.name for i, h in enumerate(inv.hosts)}
    pythons, _ = python_results({names[n]: f for n, f in facts.items()})
    problems: List[CheckProblem] = []
    for node_rank in sorted(facts):
        found = [pythons[names[node_rank]]]
        if "port" in facts[node_rank]:
            found.append(port_text(facts[node_rank]["port"], inv.master_port, names[node_rank]))
        problems += [CheckProblem(names[node_rank], node_rank, r.name, r.status, r.detail, r.hint)
                     for r in found if r.status in (FAIL, WARN)]
    return problems


def preflight_error(problems: List[CheckProblem]) -> Optional[HostsFailed]:
    """The failures of preflight() as one error naming every host (None when nothing failed)."""
    failures: Dict[str, HostError] = {}
    for p in problems:
        if p.status != FAIL:
            continue
        old = failures.get(p.host)
        failures[p.host] = PreflightError(p.host, f"{old.message}; {p.detail}" if old else p.detail,
                                          hint=old.hint if old and old.hint else p.hint)
    return HostsFailed("preflight", failures) if failures else None
