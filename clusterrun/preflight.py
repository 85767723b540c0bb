"""Launch's preflight: the cheap part of `clusterrun check`, over the connections the run already opened.

One `quick` probe per host, all at once (one round trip each, no torch import): Python runs and has
the same minor version everywhere, the workdir has room for the push, rank 0's master port is free.
The runner reports the warnings and raises `preflight_error(problems)` before pushing anything.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Mapping, Optional, Tuple

from .check_probe import run_probe
from .check_rules import FAIL, WARN, CheckProblem, CheckResult, disk_result, port_text, probe_failed, python_results, \
    shell_noise
from .errors import ConnectError, HostError, HostsFailed, PreflightError, RemoteCommandError
from .host_agent import HostAgent
from .inventory import Inventory


def preflight(inv: Inventory, agents: Mapping[int, HostAgent], manifest_bytes: Optional[int]) -> List[CheckProblem]:
    """The cheap checks over connections already open, one round trip per host, all hosts at once.

    Python runs and every host has the same minor version; the workdir has room for the push; rank 0's
    master port is free (when the inventory fixes it). torch is never imported. Returns every warning
    and failure (status "warn" or "fail"), ordered by node rank; an empty list means: go.
    """
    port = inv.master_port

    def one(item: Tuple[int, HostAgent]):
        node_rank, agent = item
        opts = {"workdir": agent.host.workdir}
        if node_rank == 0 and port is not None:
            opts.update(port=port, master_addr=inv.hosts[0].master_addr)
        try:
            return run_probe(agent.transport, agent.host.python, "quick", opts, timeout=inv.timeouts.command)
        except HostError as exc:
            if isinstance(exc, RemoteCommandError) and exc.exit_code == 127:
                return probe_failed(agent.host.python, 127, exc.message)
            return exc

    items = sorted(agents.items())
    with ThreadPoolExecutor(max_workers=min(64, max(1, len(items))), thread_name_prefix="preflight") as pool:
        answers = dict(zip([r for r, _ in items], pool.map(one, items)))
    problems: List[CheckProblem] = []
    facts: Dict[str, dict] = {}
    for node_rank, agent in items:
        name, answer = agent.host.name, answers[node_rank]
        if isinstance(answer, CheckResult):
            problems.append(CheckProblem(name, node_rank, answer.name, answer.status, answer.detail, answer.hint))
            continue
        if isinstance(answer, HostError):
            problems.append(CheckProblem(name, node_rank, "ssh" if isinstance(answer, ConnectError) else "python",
                                         FAIL, f"{answer.reason}: {answer.message}", answer.hint))
            continue
        noise = shell_noise(answer.noise)
        if noise:
            problems.append(CheckProblem(name, node_rank, "ssh", FAIL, noise.detail, noise.hint))
        found = answer.find("python")
        if found is None:
            bad = probe_failed(agent.host.python, answer.exit_code, answer.stderr)
            problems.append(CheckProblem(name, node_rank, "python", FAIL, bad.detail, bad.hint))
            continue
        facts[name] = found[1]
    pythons, _ = python_results(facts)
    for node_rank, agent in items:
        f = facts.get(agent.host.name)
        if f is None:
            continue
        found = [pythons[agent.host.name], disk_result(f["disk"], manifest_bytes)]
        if "port" in f:
            found.append(port_text(f["port"], port, agent.host.name))
        problems += [CheckProblem(agent.host.name, node_rank, r.name, r.status, r.detail, r.hint)
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
