"""Launch's preflight: the cheap part of `clusterrun check`, from facts the hosts report while the job
is pushed (no extra round trip, no torch import): Python runs and has the same minor version everywhere,
and rank 0's fixed master port is free. The push itself checks that the job fits on each host's disk.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..check.rules import FAIL, WARN, CheckProblem, port_text, python_results
from ..errors import HostError, HostsFailed, PreflightError
from ..config.inventory import Inventory
from ..events import Notice
from ..plan import LaunchPlan, build_plan, interfaces_text
from .environment import BASE_HINT


def preflight(inv: Inventory, facts: Mapping[int, Mapping]) -> List[CheckProblem]:
    """Warnings and failures, ordered by node rank; facts: node rank → what its push reported."""
    names = {i: h.name for i, h in enumerate(inv.hosts)}
    pythons, _ = python_results({names[n]: f for n, f in facts.items()})
    problems: List[CheckProblem] = []
    for node_rank in sorted(facts):
        found = [pythons[names[node_rank]]]
        base = facts[node_rank].get("env_base")
        if isinstance(base, dict) and "error" in base:  # said before anything is built on the other hosts
            problems.append(CheckProblem(names[node_rank], node_rank, "environment", FAIL,
                                         f"job.environment's base interpreter: {base['error']}", BASE_HINT))
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


def checked_plan(inv: Inventory, run_id: str, plan: LaunchPlan, held: Mapping[int, object], checks: Callable,
                 emit: Callable[[object], None]) -> Tuple[LaunchPlan, Dict[int, dict]]:
    """The cheap checks of `clusterrun check` (checks: preflight), on what every host reported while it
    received the job (held: node rank → its HeldPush); warnings said, failures raised as one error. Then
    the plan with the master port rank 0's host found free (master: {port: auto}) and each host's
    interface (network.ifname), and those interfaces by inventory index (restarts plan with them)."""
    facts = {n: h.facts for n, h in held.items()}
    problems = checks(inv, facts)
    for p in problems:  # the failures are said once, by the error they raise
        if p.status != "fail":
            emit(Notice(f"{p.host}: {p.check}: {p.detail}" + (f" ({p.hint})" if p.hint else ""), "warning"))
    failed = preflight_error(problems)
    if failed is not None:
        raise failed
    network = {plan.nodes[n].index: f["net"] for n, f in facts.items() if isinstance(f.get("net"), dict)}
    auto_port = plan.master_port is None
    port = held[0].port if auto_port else plan.master_port
    plan = build_plan(inv, run_id, master_port=port, network=network)
    if auto_port:
        emit(Notice(f"MASTER_PORT={port} (free on {plan.nodes[0].host.name})"))
    chosen = interfaces_text(plan)
    if chosen:
        emit(Notice(chosen))
    return plan, network
