"""job.environment and the stack fingerprint in a launch, between the preflight and job.setup.

With job.environment: every host's push described the base interpreter (its facts' env_base: a host that
lacks it failed the preflight, before anything was built anywhere); here each host is asked for the
venv of its key (remote/host/env/build.py: used as it is, or built once), and the hosts' fingerprints
(of the venv's python) are compared. Without it: each host's plain python is fingerprinted (cached on
the host) and compared the same way. A difference that job.environment.allow_mismatch does not accept
refuses the launch (StackMismatch, exit 2) before any rank starts.

The launch then runs with the venv's python: `with_env_pythons` gives the inventory's hosts that
python, and the plan is built from it again (ranks, torchrun, setup and notify take host.python).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..config.environment import (FINGERPRINT_FIELDS, Environment, base_command, content_key, environment_key,
                                  failing_line, index_settings, mismatches)
from ..config.inventory import Host, Inventory
from ..errors import EnvBuildError, HostsFailed, PreflightError, StackMismatch
from ..events import HostDone, LogLines, Notice
from ..hosts.group import GroupResult
from ..hosts.push import EnvResult, HeldPush
from ..plan import LaunchPlan, NodePlan, build_plan, plan_to_dict
from .wheels import Wheels, fetch, find_links_for, index_address, uses_controller

BASE_HINT = ("install it there, or name one every host has (job.environment.python: a version such as \"3.11\", "
             "a command, or a path)")
# installer lines worth a line of their own in the live view (the whole log is kept in the run folder)
_SHOWN = ("Collecting", "Downloading", "Processing", "Installing", "Successfully", "ERROR", "error:", "Resolved",
          "Prepared", "Installed", "Using", "Looking in")


def env_base(inv: Inventory, host: Host) -> Optional[str]:
    """What the host's push describes as the base interpreter (None without job.environment)."""
    env = inv.job.environment
    return None if env is None else base_command(env, host.python)


def requirements_text(inv: Inventory) -> bytes:
    env = inv.job.environment
    with open(os.path.join(inv.job.root, env.requirements), "rb") as fh:
        return fh.read()


FanOut = Callable[[str, Sequence[NodePlan], Callable[[NodePlan], object]], GroupResult]  # the runner's _fan_out


def fetch_wheels(inv: Inventory, plan: LaunchPlan, phase: Callable[[str, Callable[[], Any]], Any], fan_out: FanOut,
                 connect: Callable[[NodePlan], Any], home: str, emit: Callable[[object], None]) -> Optional[Wheels]:
    """wheels: controller (or auto, with a host that cannot reach the index), as the launch's phase
    "wheels": every host's base interpreter described before the push (a host that lacks it named before
    anything is built), then the wheels of each distinct platform downloaded here (launch/wheels.py).
    None: the hosts use the index."""
    env = inv.job.environment
    if env is None or env.wheels == "index":
        return None
    return phase("wheels", lambda: _fetch_wheels(inv, plan, fan_out, connect, home, emit))


def _fetch_wheels(inv: Inventory, plan: LaunchPlan, fan_out: FanOut, connect: Callable[[NodePlan], Any], home: str,
                  emit: Callable[[object], None]) -> Optional[Wheels]:
    env = inv.job.environment
    index = index_address(requirements_text(inv).decode("utf-8", "replace")) if env.wheels == "auto" else None
    found = fan_out("wheels", plan.nodes,
                    lambda node: connect(node).describe_base(env_base(inv, node.host), index)).results
    bases = {n.host.name: found[n.host.name] for n in plan.nodes}
    lacking = {h: PreflightError(h, f"job.environment's base interpreter: {b['error']}", hint=BASE_HINT)
               for h, b in bases.items() if "error" in b}
    if lacking:
        raise HostsFailed("preflight", lacking)
    if not uses_controller(env.wheels, bases):
        emit(Notice("wheels: every host reaches the index; each installs from there (wheels: auto)"))
        return None
    wheels = fetch(inv, bases, home)
    said = [f"{tag} ({'downloaded here with pip' if tag in wheels.downloaded else 'downloaded before'})"
            for tag in wheels.folders]
    emit(Notice(f"wheels: {len(wheels.files)} file(s) for {', '.join(said)}; pushed with the job"))
    return wheels


def dry_run(inv: Inventory) -> Optional[dict]:
    """What --dry-run says of job.environment: what would be built where (nothing connects)."""
    env = inv.job.environment
    if env is None:
        return None
    try:
        content = requirements_text(inv)
    except OSError as exc:
        return {"requirements": env.requirements, "error": str(exc)}
    index = index_settings(content.decode("utf-8", "replace"), env.wheels)
    wheels = {"index": "each host installs from its index",
              "controller": "downloaded here once per distinct host platform (pip download), pushed with the job, "
                            "installed with --no-index",
              "auto": "from the index where every host reaches it, else as wheels: controller"}[env.wheels]
    return {"requirements": env.requirements, "content_key": content_key(content, index), "wheels": env.wheels,
            "how": wheels, "hosts": {h.name: {"base": base_command(env, h.python), "venv": f"{h.workdir}/envs/KEY"}
                                     for h in inv.hosts},
            "note": "KEY hashes the file, the host's base interpreter (version, platform) and the index settings; "
                    "a host that has that venv uses it as it is (no installer), the others build it (uv where the "
                    "host has it, else pip) before any rank starts; the ranks, torchrun, setup and notify then run with the "
                    "venv's python, not the one shown above"}


def dry_run_lines(found: Mapping[str, Any]) -> List[str]:
    if "error" in found:
        return [f"environment: {found['requirements']}: {found['error']}"]
    lines = [f"environment {found['requirements']} ({found['content_key'][:8]}…), wheels: {found['wheels']}: "
             f"{found['how']}"]
    lines += [f"  {host}: {h['venv']} from {h['base']}" for host, h in found["hosts"].items()]
    return lines + [f"  {found['note']}"]


def env_request(inv: Inventory, base: Mapping[str, object], content: bytes) -> dict:
    """What a host's build step gets (pure): the key of (the file, its base interpreter as the host
    described it, the index settings), the base's executable, the file's place in the pushed job folder."""
    env: Environment = inv.job.environment
    index = index_settings(content.decode("utf-8", "replace"), env.wheels)
    return {"key": environment_key(content, base, index), "base": base.get("executable"),
            "requirements": env.requirements, "timeout": inv.timeouts.setup, "installer": "auto"}


def build_on(held: HeldPush, request: dict, host: str, node_rank: int, *, copy: str, silence_s: float,
             lines: Callable[[object], None]) -> EnvResult:
    """The build step on one host: its lines to the live view (the interesting ones) and all of them to
    the run's local HOST-environment.log."""
    def event(message: dict) -> None:
        text = message.get("text") or ""
        step = message.get("step")
        line = text if step == "line" else f"{step}{': ' + text if text else ''}"
        with open(copy, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        if step != "line" or text.lstrip().startswith(_SHOWN):
            lines(LogLines(host, node_rank, -1, (line + "\n").encode(), stream="env"))

    done = held.environment(request, event, silence_s)
    lines(HostDone("environment", host, done.seconds))
    return done


def check_stacks(prints: Mapping[str, Mapping[str, Optional[str]]], allowed: Sequence[str] = ()) -> None:
    """Refuse (StackMismatch, exit 2) when the hosts' fingerprints differ where `allowed` does not accept it."""
    found = mismatches(prints, allowed)
    if not found:
        return
    fields = [m.field for m in found]
    fix = ("make every host's stack the same: give the job a job.environment (requirements pinned: one venv "
           "per host, built the same everywhere), or install the same versions on the odd hosts; to run "
           f"anyway, job.environment.allow_mismatch: [{', '.join(fields)}]")
    raise StackMismatch([m.text() for m in found], fingerprint_table(prints, fields), fix)


def fingerprint_table(prints: Mapping[str, Mapping[str, Optional[str]]], marked: Sequence[str] = ()) -> str:
    """Every host's fingerprint as plain text columns, a field that differs marked with *."""
    head = ["host"] + [f"{f}*" if f in marked else f for f in FINGERPRINT_FIELDS]
    rows = [head] + [[host] + [str(fp.get(f) or "-") for f in FINGERPRINT_FIELDS] for host, fp in prints.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def with_env_pythons(inv: Inventory, pythons: Mapping[int, str]) -> Inventory:
    """The inventory whose hosts (by index) run the venv's python."""
    hosts = tuple(replace(h, python=pythons[i]) if i in pythons else h for i, h in enumerate(inv.hosts))
    return replace(inv, hosts=hosts)


def summary(key: str, results: Mapping[str, EnvResult]) -> str:
    """`environment 3f2a…: built on node2, node3 in 84 s (pip); node0, node1 had it`."""
    built = [h for h, r in results.items() if r.built]
    had = [h for h, r in results.items() if not r.built]
    parts: List[str] = []
    if built:
        seconds = max(results[h].seconds for h in built)
        installers = sorted({results[h].installer or "?" for h in built})
        parts.append(f"built on {', '.join(built)} in {seconds:.0f} s ({', '.join(installers)})")
    if had:
        waited = [h for h in had if results[h].waited]
        parts.append(f"{', '.join(had)} had it" + (f" ({', '.join(waited)} waited for another launch's build)"
                                                     if waited else ""))
    return f"environment {key[:8]}…: " + "; ".join(parts)


def stack_records(results: Mapping[str, EnvResult]) -> Dict[str, dict]:
    """What the registry keeps of each host's stack (ps --json, the run record)."""
    return {h: {"fingerprint": {k: v for k, v in r.fingerprint.items() if k != "cached"},
                "environment": {"key": r.key, "python": r.python, "built": r.built, "installer": r.installer}}
            for h, r in results.items()}


@dataclass(frozen=True)
class Stacks:
    """What the launch learnt of its hosts' stacks: by host name, the fingerprint and what the registry
    keeps; by inventory index, the venv's python (empty without job.environment)."""

    prints: Dict[str, Dict[str, Any]]
    records: Dict[str, dict]
    pythons: Dict[int, str]
    summary: str = ""

    def check(self, inv: Inventory) -> None:
        env = inv.job.environment
        check_stacks(self.prints, env.allow_mismatch if env is not None else ())


class Steps:
    """The two ways a launch learns its hosts' stacks, on the pushes' held channels, fanned out by the
    runner (fan_out(phase, nodes, fn) → GroupResult: every failing host named at once)."""

    def __init__(self, inv: Inventory, plan: LaunchPlan, held: Callable[[int], HeldPush],
                 fan_out: FanOut, *,
                 log_copy: Callable[[str], str], lines: Callable[[object], None], wheels: Optional[Wheels] = None):
        self.inv, self.plan, self.held, self.fan_out = inv, plan, held, fan_out
        self.log_copy, self.lines, self.wheels = log_copy, lines, wheels
        self.silence = max(inv.timeouts.host_lost, inv.timeouts.command)

    def fingerprints(self) -> Stacks:
        """A plain python on each host: its fingerprint (cached there by interpreter and site-packages), which
        came with the push's first answer (no round trip of its own)."""
        prints = {n.host.name: _bare(self.held(n.node_rank).fingerprint()) for n in self.plan.nodes}
        return Stacks(prints, {h: {"fingerprint": fp} for h, fp in prints.items()}, {})

    def build(self) -> Stacks:
        """job.environment's venv on each host, used as it is or built (its key: env_request)."""
        content = requirements_text(self.inv)

        def one(node: NodePlan) -> EnvResult:
            held = self.held(node.node_rank)
            base = held.facts.get("env_base") or {}
            request = dict(env_request(self.inv, base, content), **find_links_for(self.wheels, base))
            try:
                return build_on(held, request, node.host.name, node.node_rank, silence_s=self.silence,
                                copy=self.log_copy(node.host.name), lines=self.lines)
            except EnvBuildError as exc:
                line = failing_line(content.decode("utf-8", "replace"), exc.output_tail.splitlines(),
                                    self.inv.job.environment.requirements)
                if line is None:
                    raise
                raise EnvBuildError(exc.host, f"{exc.message}; {line}", output_tail=exc.output_tail,
                                    hint=exc.hint) from None

        found = self.fan_out("environment", self.plan.nodes, one).results
        results = {n.host.name: found[n.host.name] for n in self.plan.nodes}
        key = results[self.plan.nodes[0].host.name].key
        self.lines(Notice(summary(key, results)))
        return Stacks({h: _bare(r.fingerprint) for h, r in results.items()}, stack_records(results),
                      {n.index: results[n.host.name].python for n in self.plan.nodes}, summary(key, results))


def _bare(fingerprint: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in fingerprint.items() if k != "cached"}


def settle(inv: Inventory, plan: LaunchPlan, steps: "Steps", store: Any, phase: Callable[[str, Callable[[], Any]], Any],
           network: Any) -> "tuple":
    """The stacks found (job.environment's venvs built, else the plain pythons' fingerprints), kept in the
    run record per host and compared (a difference raises StackMismatch before any rank starts); with
    venvs, the inventory and the plan anew, every host running its venv's python."""
    stacks = steps.fingerprints() if inv.job.environment is None else phase("environment", steps.build)
    with store.batch():  # one commit for every host's stack
        for node in plan.nodes:
            store.update_host(plan.run_id, node.index, stack=json.dumps(stacks.records[node.host.name]))
    stacks.check(inv)
    if stacks.pythons:
        inv = with_env_pythons(inv, stacks.pythons)
        plan = build_plan(inv, plan.run_id, master_port=plan.master_port, network=network)
        store.update_run(plan.run_id, plan=plan_to_dict(plan))
    return inv, plan
