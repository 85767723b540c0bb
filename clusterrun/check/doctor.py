"""`clusterrun check`: a preflight doctor for every host (launch's fast subset is launch/preflight.py).

One pass, every host in parallel and none waiting for another except for rank 0's listener:
connect → (rank 0's host) bind the master port and write a token in the shared folder; (hosts 1..n-1,
where a push would relay) listen on an ephemeral port → on each host one probe (clock, Python, torch in
a child process, disk, the route to the master and a real TCP connection to the master port, one to
the next host of the relay chain, the token) → stop the listeners → judge all facts together
(rules.py, net.py), since some verdicts (versions that differ) need every host.

Adding a check: gather its fact in remote/probe.py (`facts`), write its pure rule in rules.py or
net.py, and give it a judge in JUDGES below; CHECKS (the columns) follows JUDGES' order.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..config.inventory import Host, Inventory
from ..errors import ClusterrunError, HostError, RemoteCommandError
from ..hosts.client import HostClient, make_connect
from ..hosts.group import background, fan_out
from ..hosts.relay import relay_wanted
from .gpu_rules import HostGpus, gpu_request, gpu_result, judge_all
from .net_rules import (addr_result, ib_notes, connect_result, dns_result, iface_result, mtu_results, relay_result,
                        shared_result, used_interface)
from ..hosts.probe import Listener, ProbeAnswer, Started, reach
from .rules import (CHECKS, FAIL, OK, SKIP, SKEW_WARN_S, CheckResult, HostReport, Report, clock_result, clock_skew,
                    cuda_result, disk_result, port_text, probe_failed, python_results, shell_noise, ssh_failed,
                    stack_results, torch_results)

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
    from ..plan import build_plan

    plan = build_plan(inv, "check")
    return plan.master_addr, plan.master_port


def _push_size(inv: Inventory) -> Tuple[Optional[int], str]:
    if inv.job.script is None:
        return None, ""
    from ..hosts.manifest import HashCache, build_manifest

    try:
        return build_manifest(inv.job, HashCache(None)).total_bytes, ""
    except ClusterrunError as exc:
        return None, str(exc)


def _ssh_ok(host: Host, seconds: float, route: str = "") -> CheckResult:
    if host.connection == "local":
        return CheckResult("ssh", OK, "local host (no SSH)", "", "local")
    meaning = {"strict": "strict: unknown hosts refused",
               "accept-new": "accept-new: new hosts recorded, changed keys refused"}.get(host.host_key_policy, "")
    return CheckResult("ssh", OK, f"{host.user + '@' if host.user else ''}{host.host} in {seconds * 1000:.0f} ms; "
                                  f"host key verified ({meaning})" + (f"; {route}" if route else ""), "",
                       f"{seconds * 1000:.0f} ms", {"seconds": round(seconds, 4), "policy": host.host_key_policy,
                                                    "route": route})


def _no_answer(exc: HostError, python: str) -> CheckResult:
    if isinstance(exc, RemoteCommandError) and exc.command_exit == 127:
        return probe_failed(python, 127, exc.message)
    return CheckResult("python", FAIL, f"{exc.reason}: {exc.message}", exc.hint, "no answer")


class _Session:
    """One `check`: the hosts' connections, and rank 0's listener that every host's probe connects to."""

    def __init__(self, inv: Inventory, connect: Callable[[Host], HostClient], gpu_check: bool = True):
        self.inv = inv
        self.gpu_check = gpu_check
        self.connect = connect
        self.master_addr, self.wanted_port = _master(inv)
        self.token = secrets.token_hex(8)
        self.shared_file = f"{inv.job.shared_dir.rstrip('/')}/.clusterrun-check-{self.token}" \
            if inv.job.init_method == "file" and inv.job.shared_dir else None
        self.ready = threading.Event()  # rank 0's listener started, or will not
        self.listener: Optional[Listener] = None
        self.listener_error = ""
        self.clients: List[HostClient] = []
        self._lock = threading.Lock()
        # the relay chain (hosts/relay.py): host j connects to host j+1, which listens while the probes run
        self.chain = relay_wanted(inv.relay, len(inv.hosts))
        self.relay_listeners: Dict[int, Listener] = {}
        self.relay_ready = [threading.Event() for _ in inv.hosts]

    def observe(self, node_rank: int, host: Host) -> Observed:
        try:
            return self._observe(node_rank, host)
        except Exception as exc:  # a bug or an unexpected library error: still report every other host
            return Observed(host, node_rank, CheckResult("ssh", FAIL, f"check failed: {exc!r}", "", "error"))
        finally:
            self.relay_ready[node_rank].set()
            if node_rank == 0:
                self.ready.set()  # whatever happened, the other hosts must not wait for a listener

    def _observe(self, node_rank: int, host: Host) -> Observed:
        t = self.inv.timeouts
        started = time.monotonic()
        try:
            client = self.connect(host)
        except HostError as exc:
            return Observed(host, node_rank, ssh_failed(exc))
        with self._lock:
            self.clients.append(client)
        ssh = _ssh_ok(host, time.monotonic() - started, getattr(client, "route", ""))
        deadline = time.monotonic() + t.command
        try:  # first, so that the slow torch import overlaps everything else
            facts = Started(client.transport, host.python, "facts", {
                "workdir": host.workdir, "master_addr": self.master_addr, "own_addr": host.master_addr,
                "torch": True, "env": dict(host.env),
                "torch_timeout": max(1.0, t.command - 2),
                "gpu": gpu_request(host, t.command) if self.gpu_check else None})
            facts.early("time", deadline)
        except HostError as exc:
            return Observed(host, node_rank, ssh, failure=_no_answer(exc, host.python))
        try:
            self._relay_listen(node_rank, client)
            reach = self._rendezvous(node_rank, client)
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

    def _relay_listen(self, node_rank: int, client: HostClient) -> None:
        if self.chain and node_rank > 0:
            try:
                listener = Listener(client.transport, client.host.python, {
                    "port": 0, "master_addr": client.host.master_addr, "expect": 1,
                    "deadline": self.inv.timeouts.connect + 2 * self.inv.timeouts.command}, timeout=self.inv.timeouts.command)
                with self._lock:
                    self.relay_listeners[node_rank] = listener
            except HostError:
                pass  # the host before it shows "not tested"
        self.relay_ready[node_rank].set()

    def _relay_peer(self, node_rank: int) -> Optional[dict]:
        """The next host's relay listener, once it listens (or gave up)."""
        t = self.inv.timeouts
        if not self.chain or node_rank + 1 >= len(self.inv.hosts):
            return None
        self.relay_ready[node_rank + 1].wait(t.connect + t.command)
        listener = self.relay_listeners.get(node_rank + 1)
        if listener is None or not listener.port:
            return None
        return {"addr": self.inv.hosts[node_rank + 1].master_addr, "port": listener.port}

    def _rendezvous(self, node_rank: int, client: HostClient) -> Optional[dict]:
        """Rank 0's host starts the listener (and writes the token); every host then connects to it."""
        t = self.inv.timeouts
        if node_rank == 0:
            try:
                self.listener = Listener(client.transport, client.host.python, {
                    "port": self.wanted_port or 0, "master_addr": self.master_addr, "expect": len(self.inv.hosts),
                    "deadline": t.connect + 2 * t.command, "shared_file": self.shared_file, "token": self.token},
                    timeout=t.command)
            except HostError as exc:
                self.listener_error = f"{exc.reason}: {exc.message}"
            finally:
                self.ready.set()
        else:
            self.ready.wait(t.connect + t.command)
        return reach(client.transport, client.host, node_rank, self.listener, self.master_addr, self.shared_file, self.token,
                      min(PROBE_CONNECT_S, t.connect), t.command, self._relay_peer(node_rank))

    def finish_relay(self, observed: List[Observed]) -> Optional[Dict[int, frozenset]]:
        """Stop the relay listeners; the names each one saw, by node rank (None: no chain tested)."""
        if not self.chain:
            return None
        seen = {}
        for j, listener in sorted(self.relay_listeners.items()):
            before = observed[j - 1]
            came = ((before.reach or {}).get("relay") or {}).get("status") == "ok"
            listener.finish([before.host.name] if came else [], LISTENER_LINGER_S)
            seen[j] = frozenset(name for _, name in listener.peers)
        return seen

    def finish(self, observed: List[Observed]) -> Optional[ListenerSeen]:
        """Stop the listener (once it saw the hosts that connected) and say what it saw."""
        if self.listener is not None:
            connected = [o.host.name for o in observed if ((o.reach or {}).get("connect") or {}).get("status") == "ok"]
            self.listener.finish(connected, LISTENER_LINGER_S)
            return ListenerSeen(self.listener.ready, self.listener.error, tuple(self.listener.peers))
        if self.listener_error:
            return ListenerSeen({}, self.listener_error, ())
        return None

    def close(self) -> None:
        for client in self.clients:
            client.close()


def run_checks(inv: Inventory, *, connect: Optional[Callable[[Host], HostClient]] = None,
               gpu_check: bool = True) -> Report:
    """Check every host of inv in parallel and judge the facts; never raises for a host's problem.
    gpu_check: False skips the GPU preflight (--no-gpu-check)."""
    t0 = time.monotonic()
    session = _Session(inv, connect or make_connect(inv.timeouts), gpu_check)
    try:
        push = background(_push_size, inv, thread_name="check-push")  # hashing the job overlaps the network work
        hosts = list(enumerate(inv.hosts))
        found = fan_out(hosts, lambda item: session.observe(*item),
                        name=lambda item: item[1].name, thread_name="check")
        observed = [found.results[h.name] for _, h in hosts]
        seen = session.finish(observed)
        relay_seen = session.finish_relay(observed)
        push_bytes, push_error = push.result()
    finally:
        session.close()
    return evaluate(inv, observed, seen, session.master_addr, session.wanted_port, push_bytes, push_error,
                    seconds=time.monotonic() - t0, relay_seen=relay_seen)


@dataclass(frozen=True)
class _Context:
    """What every host's judges may look at: the inventory, the verdicts across hosts, the listener."""

    inv: Inventory
    master_addr: str
    wanted_port: Optional[int]
    port: Optional[int]  # what was tested: the bound port, or the wanted one
    bound: Mapping  # rank 0's bind of the master port ({} when it was not tried)
    ready: Mapping  # the listener's ready line ({} when it did not start)
    no_test: str  # why the connection test could not run ("" when it did)
    peers: Optional[frozenset]  # names the listener saw (None: unknown)
    multi_machine: bool
    pythons: Mapping[str, CheckResult]
    torches: Mapping[str, CheckResult]
    stacks: Mapping[str, CheckResult]
    mtus: Mapping[str, CheckResult]
    gpus: Mapping[str, HostGpus]  # the GPU preflight's verdicts, peers compared; hosts it did not run on absent
    push_bytes: Optional[int]
    push_error: str
    relay_seen: Optional[Mapping[int, frozenset]]  # names each relay listener saw, by node rank (None: no chain)

    @property
    def rank0(self) -> str:
        return self.inv.hosts[0].name


Judge = Callable[[_Context, Observed, dict], CheckResult]


def _python(c: _Context, o: Observed, f: dict) -> CheckResult:
    return c.pythons[o.host.name]


def _stack(c: _Context, o: Observed, f: dict) -> CheckResult:
    return c.stacks.get(o.host.name) or CheckResult("stack", SKIP, "not probed", "", "·")


def _torch(c: _Context, o: Observed, f: dict) -> CheckResult:
    return c.torches.get(o.host.name) or CheckResult("torch", SKIP, "not probed", "", "·")


def _cuda(c: _Context, o: Observed, f: dict) -> CheckResult:
    torch = f.get("torch", {})
    if "version" not in torch:
        return CheckResult("cuda", SKIP, "torch does not import", "", "·")
    return cuda_result(c.inv.job.backend, o.host.slots, torch)


def _gpu(c: _Context, o: Observed, f: dict) -> CheckResult:
    if "gpu" not in f:
        skipped = CheckResult("gpu", SKIP, "skipped (gpu_check: false, or --no-gpu-check)", "", "·")
        return gpu_result(None) if o.host.gpus is None else skipped
    return gpu_result(c.gpus.get(o.host.name))


def _port(c: _Context, o: Observed, f: dict) -> CheckResult:
    if o.node_rank != 0:
        return CheckResult("port", SKIP, f"checked on {c.rank0} (rank 0's host)", "", "·")
    return port_text(c.bound, c.wanted_port, o.host.name) if c.bound else CheckResult("port", SKIP, c.no_test, "", "·")


def _connect(c: _Context, o: Observed, f: dict) -> CheckResult:
    net = {**f["net"], **({"connect": o.reach["connect"]} if o.reach and "connect" in o.reach else {})}
    return connect_result(net, c.master_addr, c.port, c.rank0, skipped=c.no_test,
                          seen=None if c.peers is None else o.host.name in c.peers)


def _iface(c: _Context, o: Observed, f: dict) -> CheckResult:
    return iface_result(f["net"], c.inv.job.backend, o.host.env, c.multi_machine, o.host.ifname)


def _addr(c: _Context, o: Observed, f: dict) -> CheckResult:
    return addr_result(f["net"], o.host.master_addr, o.host.addr is not None, o.host.connection)


def _dns(c: _Context, o: Observed, f: dict) -> CheckResult:
    return dns_result(f["net"])


def _mtu(c: _Context, o: Observed, f: dict) -> CheckResult:
    return c.mtus.get(o.host.name) or CheckResult("mtu", SKIP, "not probed", "", "·")


def _disk(c: _Context, o: Observed, f: dict) -> CheckResult:
    return disk_result(f["disk"], c.push_bytes, c.push_error)


def _shared(c: _Context, o: Observed, f: dict) -> CheckResult:
    return shared_result(c.inv.job.init_method, c.inv.job.shared_dir, c.rank0, is_rank0=o.node_rank == 0,
                         written=c.ready.get("shared") if c.ready else None, read=(o.reach or {}).get("shared"))


def _relay(c: _Context, o: Observed, f: dict) -> CheckResult:
    nxt = o.node_rank + 1
    last = nxt >= len(c.inv.hosts)
    seen = None if c.relay_seen is None or last or nxt not in c.relay_seen else o.host.name in c.relay_seen[nxt]
    return relay_result(c.inv.relay, c.relay_seen is not None, None if last else c.inv.hosts[nxt].name,
                        "" if last else c.inv.hosts[nxt].master_addr, (o.reach or {}).get("relay"), seen)


def _clock(c: _Context, o: Observed, f: dict) -> CheckResult:
    stamp = o.answer.find("time") if o.answer else None
    if not stamp:
        return CheckResult("clock", SKIP, "no time reading", "", "·")
    return clock_result(o.answer.sent, stamp[1]["time"], stamp[0])


# Every check after ssh, in the order of the report's columns (rules.CHECKS must list the same names).
JUDGES: Dict[str, Judge] = {"python": _python, "torch": _torch, "cuda": _cuda, "gpu": _gpu, "stack": _stack, "port": _port, "connect": _connect,
                            "iface": _iface, "addr": _addr, "dns": _dns, "mtu": _mtu, "disk": _disk,
                            "shared": _shared, "relay": _relay,
                            "clock": _clock}


def _context(inv: Inventory, observed: List[Observed], listener: Optional[ListenerSeen], master_addr: str,
             wanted_port: Optional[int], push_bytes: Optional[int], push_error: str,
             relay_seen: Optional[Mapping[int, frozenset]]) -> Tuple[_Context, List[str]]:
    rank0 = inv.hosts[0].name
    facts = {o.host.name: o.facts for o in observed if o.facts}
    pythons, notes = python_results(facts)
    torches, torch_notes = torch_results({h: f["torch"] for h, f in facts.items() if "torch" in f},
                                         {h: f["executable"] for h, f in facts.items()})
    stacks = _stacks(inv, facts)
    hosts = {h.name: h for h in inv.hosts}
    mtus, mtu_notes = mtu_results({h: used_interface(f["net"], hosts[h].ifname, hosts[h].env, inv.job.backend)
                                   for h, f in facts.items() if "net" in f})
    gpus, gpu_notes = judge_all(inv.hosts, facts)
    ready = listener.ready if listener else {}
    bound = ready.get("port") or {}
    context = _Context(inv, master_addr, wanted_port, bound.get("port") if bound.get("free") else wanted_port,
                       bound, ready, _no_test(listener, rank0),
                       frozenset(name for _, name in listener.peers) if listener and ready else None,
                       _machine_count(inv) > 1, pythons, torches, stacks, mtus, gpus, push_bytes, push_error, relay_seen)
    ib = ib_notes(facts, inv.job.backend, inv.hosts)
    return context, notes + torch_notes + mtu_notes + gpu_notes + ib


def _stacks(inv: Inventory, facts: Mapping[str, dict]) -> Mapping[str, CheckResult]:
    env = inv.job.environment
    return stack_results({h: f["stack"] for h, f in facts.items() if "stack" in f},
                         env.allow_mismatch if env is not None else ())


def _no_test(listener: Optional[ListenerSeen], rank0: str) -> str:
    """Why the connection test could not run ("" when it did)."""
    if listener is None:
        return f"{rank0} was not reachable"
    if not listener.ready:
        return f"no listener on {rank0}: {listener.error}"
    return "" if (listener.ready.get("port") or {}).get("free") else f"the master port could not be bound on {rank0}"


def _machine_count(inv: Inventory) -> int:
    # local hosts share this machine: loopback and a loopback hostname are fine among them
    return len({"local" if h.connection == "local" else h.master_addr for h in inv.hosts})


def evaluate(inv: Inventory, observed: List[Observed], listener: Optional[ListenerSeen], master_addr: str,
             wanted_port: Optional[int], push_bytes: Optional[int], push_error: str = "",
             seconds: float = 0.0, relay_seen: Optional[Mapping[int, frozenset]] = None) -> Report:
    """Every host's results, in CHECKS order, from what the hosts showed (pure). relay_seen: None where no
    relay chain was tested."""
    context, notes = _context(inv, observed, listener, master_addr, wanted_port, push_bytes, push_error, relay_seen)
    skews = {}
    hosts = []
    for o in observed:
        f = o.facts
        noise = shell_noise(o.answer.noise) if o.answer else None
        results = [noise or (replace(o.ssh, detail=o.ssh.detail + "; the login shell runs commands") if f else o.ssh)]
        if f is None:
            results.append(o.failure or CheckResult("python", SKIP, "host not reachable", "", "·"))
            why = "host not reachable" if o.ssh.status == FAIL else "the probe did not run"
            results += [CheckResult(c, SKIP, why, "", "·") for c in CHECKS[2:]]
        else:
            results += [judge(context, o, f) for judge in JUDGES.values()]
            stamp = o.answer.find("time") if o.answer else None
            if stamp:
                skews[o.host.name] = clock_skew(o.answer.sent, stamp[1]["time"], stamp[0])[0]
        hosts.append(HostReport(o.host.name, o.node_rank, tuple(results)))
    if len(skews) > 1 and max(skews.values()) - min(skews.values()) > SKEW_WARN_S:
        notes.append(f"clocks differ by {max(skews.values()) - min(skews.values()):.1f} s between "
                     f"{max(skews, key=skews.get)} and {min(skews, key=skews.get)}")
    return Report(tuple(hosts), master_addr, context.port, seconds, tuple(notes))
