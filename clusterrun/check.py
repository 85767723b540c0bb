"""`clusterrun check`: a preflight doctor for every host (launch's fast subset is preflight.py).

One pass, every host in parallel and none waiting for another except for rank 0's listener:
connect → (rank 0's host) bind the master port and write a token in the shared folder → on each host
one probe (clock, Python, torch in a child process, disk, the route to the master and a real TCP
connection to the master port, the token) → stop the listener → judge all facts together (check_rules,
check_net), since some verdicts (versions that differ) need every host.
"""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from .check_net import connect_result, iface_result, shared_result
from .check_probe import Listener, ProbeAnswer, Started, run_probe
from .check_render import render_checks  # noqa: F401  (the CLI's entry point lives here too)
from .check_rules import (CHECKS, FAIL, OK, SKIP, SKEW_WARN_S, CheckResult, HostReport, Report, clock_result,
                          clock_skew, cuda_result, disk_result, port_text, probe_failed, python_results, shell_noise,
                          ssh_failed, torch_results)
from .errors import ClusterrunError, HostError, RemoteCommandError
from .host_agent import HostAgent, make_connect
from .inventory import Host, Inventory

PROBE_CONNECT_S = 3.0  # a firewall that drops packets makes the test connection wait this long, at most
LISTENER_LINGER_S = 1.0  # how long to wait for the listener to report connections the hosts made


@dataclass(frozen=True)
class Observed:
    """What one host showed: its ssh verdict, and the probe's answer or why there is none."""

    host: Host
    node_rank: int
    ssh: CheckResult
    answer: Optional[ProbeAnswer] = None
    failure: Optional[CheckResult] = None  # the python verdict when the probe gave no facts
    reach: Optional[Mapping] = None  # the reach probe's answer: connect to the master port, shared token

    @property
    def facts(self) -> Optional[dict]:
        found = self.answer.find("facts") if self.answer else None
        return found[1]["facts"] if found and self.failure is None else None


@dataclass(frozen=True)
class ListenerSeen:
    """Rank 0's listener after it was stopped: its ready line (bind, token file), or why it never started."""

    ready: Mapping
    error: str
    peers: Tuple[Tuple[str, str], ...]


def _master(inv: Inventory) -> Tuple[str, Optional[int]]:
    if inv.job.script is None:  # a bare hostfile: same rule as the plan's, without needing a script
        return inv.hosts[0].master_addr, inv.master_port
    from .plan import build_plan

    plan = build_plan(inv, "check")
    return plan.master_addr, plan.master_port


def _push_size(inv: Inventory) -> Tuple[Optional[int], str]:
    if inv.job.script is None:
        return None, ""
    from .sync import HashCache, build_manifest

    try:
        return build_manifest(inv.job, HashCache(None)).total_bytes, ""
    except ClusterrunError as exc:
        return None, str(exc)


def _ssh_ok(host: Host, seconds: float) -> CheckResult:
    if host.connection == "local":
        return CheckResult("ssh", OK, "local host (no SSH)", "", "local")
    meaning = {"strict": "strict: unknown hosts refused",
               "accept-new": "accept-new: new hosts recorded, changed keys refused"}.get(host.host_key_policy, "")
    return CheckResult("ssh", OK, f"{host.user + '@' if host.user else ''}{host.host} in {seconds * 1000:.0f} ms; "
                                  f"host key verified ({meaning})", "",
                       f"{seconds * 1000:.0f} ms", {"seconds": round(seconds, 4), "policy": host.host_key_policy})


def _no_answer(exc: HostError, python: str) -> CheckResult:
    if isinstance(exc, RemoteCommandError) and exc.exit_code == 127:
        return probe_failed(python, 127, exc.message)
    return CheckResult("python", FAIL, f"{exc.reason}: {exc.message}", exc.hint, "no answer")


def _reach(agent: HostAgent, node_rank: int, listener: object, master_addr: str, shared_file: Optional[str],
           token: str, connect_timeout: float, timeout: float) -> Optional[dict]:
    """The connection to rank 0's listener and the read of its token file, while both exist."""
    if not isinstance(listener, Listener):
        return None
    written = (listener.ready.get("shared") or {}).get("status") == "ok"
    opts = {"master_addr": master_addr, "port": listener.port, "connect_timeout": connect_timeout,
            "name": agent.host.name, "shared_file": shared_file if written and node_rank else None, "token": token}
    if not opts["port"] and not opts["shared_file"]:
        return None
    try:
        found = run_probe(agent.transport, agent.host.python, "reach", opts, timeout=timeout).find("reach")
    except HostError as exc:
        return {"connect": {"status": "error", "error": f"{exc.reason}: {exc.message}"}}
    return found[1]["reach"] if found else None


def run_checks(inv: Inventory, *, connect: Optional[Callable[[Host], HostAgent]] = None) -> Report:
    """Check every host of inv in parallel and judge the facts; never raises for a host's problem."""
    t0 = time.monotonic()
    connect = connect or make_connect(inv.timeouts)
    master_addr, wanted_port = _master(inv)
    token = secrets.token_hex(8)
    shared_file = f"{inv.job.shared_dir.rstrip('/')}/.clusterrun-check-{token}" \
        if inv.job.init_method == "file" and inv.job.shared_dir else None
    t = inv.timeouts
    ready = threading.Event()
    box: Dict[str, object] = {}  # the listener, or why it could not start
    agents: List[HostAgent] = []
    lock = threading.Lock()

    def rendezvous(node_rank: int, agent: HostAgent) -> Optional[dict]:
        """Rank 0's host starts the listener (and writes the token); every host then connects to it."""
        if node_rank == 0:
            try:
                box["listener"] = Listener(agent.transport, agent.host.python, {
                    "port": wanted_port or 0, "master_addr": master_addr, "expect": len(inv.hosts),
                    "deadline": t.connect + 2 * t.command, "shared_file": shared_file, "token": token},
                    timeout=t.command)
            except HostError as exc:
                box["error"] = f"{exc.reason}: {exc.message}"
            finally:
                ready.set()
        else:
            ready.wait(t.connect + t.command)
        return _reach(agent, node_rank, box.get("listener"), master_addr, shared_file, token,
                      min(PROBE_CONNECT_S, t.connect), t.command)

    def observe(node_rank: int, host: Host) -> Observed:
        started = time.monotonic()
        try:
            agent = connect(host)
        except HostError as exc:
            if node_rank == 0:
                ready.set()
            return Observed(host, node_rank, ssh_failed(exc))
        with lock:
            agents.append(agent)
        ssh = _ssh_ok(host, time.monotonic() - started)
        deadline = time.monotonic() + t.command
        try:  # first, so that the slow torch import overlaps everything else
            facts = Started(agent.transport, host.python, "facts", {
                "workdir": host.workdir, "master_addr": master_addr, "torch": True, "env": dict(host.env),
                "torch_timeout": max(1.0, t.command - 2)})
            facts.early("time", deadline)
        except HostError as exc:
            if node_rank == 0:
                ready.set()
            return Observed(host, node_rank, ssh, failure=_no_answer(exc, host.python))
        try:
            reach = rendezvous(node_rank, agent)
        except BaseException:
            facts.close()
            raise
        try:
            answer = facts.collect(deadline)
        except HostError as exc:
            return Observed(host, node_rank, ssh, failure=_no_answer(exc, host.python), reach=reach)
        if answer.find("facts") is None:
            return Observed(host, node_rank, ssh, answer, probe_failed(host.python, answer.exit_code, answer.stderr),
                            reach)
        return Observed(host, node_rank, ssh, answer, reach=reach)

    def guarded(node_rank: int, host: Host) -> Observed:
        try:
            return observe(node_rank, host)
        except Exception as exc:  # a bug or an unexpected library error: still report every other host
            if node_rank == 0:
                ready.set()
            return Observed(host, node_rank, CheckResult("ssh", FAIL, f"check failed: {exc!r}", "", "error"))

    pool = ThreadPoolExecutor(max_workers=min(64, len(inv.hosts)) + 1, thread_name_prefix="check")
    try:
        push = pool.submit(_push_size, inv)  # hashing the job overlaps the network work
        futures = [pool.submit(guarded, i, h) for i, h in enumerate(inv.hosts)]
        observed = [f.result() for f in futures]
        listener = box.get("listener")
        seen = None
        if isinstance(listener, Listener):
            connected = [o.host.name for o in observed if ((o.reach or {}).get("connect") or {}).get("status") == "ok"]
            listener.finish(connected, LISTENER_LINGER_S)
            seen = ListenerSeen(listener.ready, listener.error, tuple(listener.peers))
        elif "error" in box:
            seen = ListenerSeen({}, str(box["error"]), ())
        push_bytes, push_error = push.result()
    finally:
        for agent in agents:
            agent.close()
        pool.shutdown(wait=False)
    return evaluate(inv, observed, seen, master_addr, wanted_port, push_bytes, push_error,
                    seconds=time.monotonic() - t0)


def evaluate(inv: Inventory, observed: List[Observed], listener: Optional[ListenerSeen], master_addr: str,
             wanted_port: Optional[int], push_bytes: Optional[int], push_error: str = "",
             seconds: float = 0.0) -> Report:
    """Every host's results, in CHECKS order, from what the hosts showed (pure)."""
    rank0 = inv.hosts[0].name
    facts = {o.host.name: o.facts for o in observed if o.facts}
    pythons, notes = python_results(facts)
    torches, torch_notes = torch_results({h: f["torch"] for h, f in facts.items() if "torch" in f},
                                         {h: f["executable"] for h, f in facts.items()})
    notes += torch_notes
    ready = listener.ready if listener else {}
    bound = ready.get("port") or {}
    port = bound.get("port") if bound.get("free") else wanted_port
    if listener is None:
        no_test = f"{rank0} was not reachable"
    elif not ready:
        no_test = f"no listener on {rank0}: {listener.error}"
    else:
        no_test = "" if bound.get("free") else f"the master port could not be bound on {rank0}"
    peers = {name for _, name in listener.peers} if listener and ready else None
    # local hosts share this machine: loopback and a loopback hostname are fine among them
    machines = len({"local" if h.connection == "local" else h.master_addr for h in inv.hosts})
    skews = {}
    hosts = []
    for o in observed:
        name, f = o.host.name, o.facts
        noise = shell_noise(o.answer.noise) if o.answer else None
        results = [noise or (replace(o.ssh, detail=o.ssh.detail + "; the login shell runs commands") if f else o.ssh)]
        if f is None:
            results.append(o.failure or CheckResult("python", SKIP, "host not reachable", "", "·"))
            why = "host not reachable" if o.ssh.status == FAIL else "the probe did not run"
            results += [CheckResult(c, SKIP, why, "", "·") for c in CHECKS[2:]]
            hosts.append(HostReport(name, o.node_rank, tuple(results)))
            continue
        results.append(pythons[name])
        torch = f.get("torch", {})
        results.append(torches.get(name) or CheckResult("torch", SKIP, "not probed", "", "·"))
        results.append(cuda_result(inv.job.backend, o.host.slots, torch) if "version" in torch
                       else CheckResult("cuda", SKIP, "torch does not import", "", "·"))
        if o.node_rank == 0:
            results.append(port_text(bound, wanted_port, name) if bound
                           else CheckResult("port", SKIP, no_test, "", "·"))
        else:
            results.append(CheckResult("port", SKIP, f"checked on {rank0} (rank 0's host)", "", "·"))
        net = {**f["net"], **({"connect": o.reach["connect"]} if o.reach and "connect" in o.reach else {})}
        results.append(connect_result(net, master_addr, port, rank0, skipped=no_test,
                                      seen=None if peers is None else name in peers))
        results.append(iface_result(f["net"], inv.job.backend, o.host.env, machines > 1))
        results.append(disk_result(f["disk"], push_bytes, push_error))
        results.append(shared_result(inv.job.init_method, inv.job.shared_dir, rank0, is_rank0=o.node_rank == 0,
                                     written=ready.get("shared") if ready else None,
                                     read=(o.reach or {}).get("shared")))
        stamp = o.answer.find("time") if o.answer else None
        if stamp:
            results.append(clock_result(o.answer.sent, stamp[1]["time"], stamp[0]))
            skews[name] = clock_skew(o.answer.sent, stamp[1]["time"], stamp[0])[0]
        else:
            results.append(CheckResult("clock", SKIP, "no time reading", "", "·"))
        hosts.append(HostReport(name, o.node_rank, tuple(results)))
    if len(skews) > 1 and max(skews.values()) - min(skews.values()) > SKEW_WARN_S:
        notes.append(f"clocks differ by {max(skews.values()) - min(skews.values()):.1f} s between "
                     f"{max(skews, key=skews.get)} and {min(skews, key=skews.get)}")
    return Report(tuple(hosts), master_addr, port, seconds, tuple(notes))
