"""One run, start to end: connect → push → start (rank 0's host first) → follow → stop → result.

The runner owns no terminal: it posts events to `emit` from its own (main) thread, which the CLI
renders. Host work fans out to threads; every phase reports all failed hosts at once.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, replace
from typing import Callable, Dict, List, Mapping, Optional

from .errors import (EXIT_INTERRUPTED, EXIT_OK, ClusterrunError, ConnectError, HostError, HostsFailed,
                     RemoteCommandError)
from .events import HostDone, HostProgress, Notice, Phase, RunOutcome
from .host_agent import HeldPush, HostAgent
from .inventory import Host, Inventory
from .monitor import Monitor
from .plan import LaunchPlan, NodePlan, build_plan, plan_to_dict, rank_env
from .preflight import preflight, preflight_error
from .remote.host.procs import start_ticks
from .store import RunStore
from .sync import HashCache, Manifest, build_manifest

Connect = Callable[[Host], HostAgent]


class Interrupted(Exception):
    pass


def controller_identity() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "ticks": start_ticks(os.getpid())}


def controller_alive(ident: Optional[dict]) -> bool:
    """Is the controller that wrote this record still running (same machine, same pid, same start)?"""
    if not ident or ident.get("host") != socket.gethostname() or not ident.get("pid"):
        return False
    try:
        os.kill(ident["pid"], 0)
    except (ProcessLookupError, PermissionError):
        return False
    return ident.get("ticks") is None or start_ticks(ident["pid"]) == ident["ticks"]


def inventory_snapshot(inv: Inventory) -> dict:
    """The inventory as recorded with the run: enough to reach the hosts again; secret names only."""
    return asdict(inv)


class Runner:
    def __init__(self, inv: Inventory, run_id: str, *, store: RunStore, connect: Connect,
                 secrets: Mapping[str, str], emit: Callable[[object], None], detach: bool = False,
                 hash_cache: Optional[HashCache] = None, checks: Callable = preflight):
        self.inv = inv
        self.run_id = run_id
        self.store = store
        self._connect = connect
        self._secrets = dict(secrets)
        self._emit = emit
        self._detach = detach
        self._hash_cache = hash_cache or HashCache(None)
        self._checks = checks
        # bounded: a slow terminal pushes back on the followers and the SSH window, never on the ranks
        self._q: "queue.Queue" = queue.Queue(maxsize=64)
        self._agents: Dict[int, HostAgent] = {}
        self._agents_lock = threading.Lock()
        self._interrupts: List[float] = []
        self._closing = False
        self._t0 = time.monotonic()
        self._phases: List[tuple] = []
        self.monitor: Optional[Monitor] = None
        self._held: Dict[int, HeldPush] = {}  # pushed, waiting for their start on the push's channel
        self._started: List[int] = []

    # -------------------------------------------------------------- signals

    def interrupt(self) -> None:
        """Ctrl-C: the first stops gracefully, a second within a second kills at once (signal-handler safe)."""
        self._interrupts.append(time.monotonic())
        if self.monitor is not None:
            self.monitor.interrupt(force=self.force_requested)

    @property
    def force_requested(self) -> bool:
        return len(self._interrupts) >= 2 and self._interrupts[-1] - self._interrupts[-2] <= 1.0

    # -------------------------------------------------------------- the run

    def run(self) -> RunOutcome:
        plan = build_plan(self.inv, self.run_id)
        self.store.create(self.run_id, self.inv.path, inventory_snapshot(self.inv), plan_to_dict(plan),
                          controller_identity(), [{"node_rank": n.node_rank, "name": n.host.name} for n in plan.nodes],
                          [{"rank": r.rank, "node_rank": r.node_rank, "host": r.host_name} for r in plan.ranks])
        background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="manifest")
        try:
            # what to push is worked out while the connections are being made
            self._prepare(plan, background.submit(build_manifest, self.inv.job, self._hash_cache))
            auto_port = plan.master_port is None
            # the cheap checks of `clusterrun check`, on what every host reported while receiving the job
            with self._agents_lock:
                facts = {n: held.facts for n, held in self._held.items()}
            problems = self._checks(self.inv, facts)
            for p in problems:
                self._emit(Notice(f"{p.host}: {p.check}: {p.detail}" + (f" ({p.hint})" if p.hint else ""),
                                  "error" if p.status == "fail" else "warning"))
            failed = preflight_error(problems)
            if failed is not None:
                raise failed
            if auto_port:  # rank 0's host found a free port while receiving the job
                port = self._held[0].port
                plan = build_plan(self.inv, self.run_id, master_port=port)
                self.store.update_run(self.run_id, plan=plan_to_dict(plan))
                self._emit(Notice(f"MASTER_PORT={port} (free on {plan.nodes[0].host.name})"))
            self._phase("start", lambda: self._start_all(plan))
            if self._detach:
                self.store.update_run(self.run_id, state="running", detached=1, controller=None)
                return RunOutcome(self.run_id, "running", EXIT_OK, "detached", seconds=self._elapsed(),
                                  phases=tuple(self._phases))
            self.store.update_run(self.run_id, state="running")
            self.monitor = Monitor(plan, self.store, agent=self._agent, reconnect=self._reconnect, emit=self._emit,
                                   events=self._q, timeouts=self.inv.timeouts, t0=self._t0)
            if self._interrupts:
                self.monitor.interrupt(force=self.force_requested)
            outcome = self.monitor.run()
            return replace(outcome, phases=tuple(self._phases) + (("run", outcome.seconds),),
                           seconds=self._elapsed())
        except Interrupted:
            self._undo(plan, grace=0.0 if self.force_requested else self.inv.timeouts.grace)
            return self._finish("interrupted", EXIT_INTERRUPTED, "interrupted by the user (Ctrl-C)")
        except ClusterrunError as exc:  # hosts failed, or a bad job file found while connecting
            self._undo(plan, grace=0.0)
            self._finish("failed", exc.exit_code, str(exc))
            raise
        finally:
            background.shutdown(wait=False)
            self._closing = True
            self._abandon_held()
            with self._agents_lock:
                agents = list(self._agents.values())
            for agent in agents:
                agent.close()

    def _finish(self, state: str, code: int, reason: str) -> RunOutcome:
        self.store.update_run(self.run_id, state=state, exit_code=code, reason=reason, ended_at=time.time())
        for r in self.store.get(self.run_id).ranks:
            if r["state"] == "pending":
                self.store.update_rank(self.run_id, r["rank"], state="not-started")
        return RunOutcome(self.run_id, state, code, reason, seconds=self._elapsed(), phases=tuple(self._phases))

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _phase(self, name: str, body: Callable[[], None]) -> None:
        t = time.monotonic()
        self._emit(Phase(name))
        body()
        self._phases.append((name, time.monotonic() - t))
        self.store.update_run(self.run_id, phases={n: round(s, 4) for n, s in self._phases})

    def _prepare(self, plan: LaunchPlan, manifest: "Future[Manifest]") -> None:
        """Connect to every host and push to each as soon as it is connected: no barrier between the two,
        so a slow host delays only itself. Phases: connect (until the last host is connected), push."""
        t0 = time.monotonic()
        connected: List[float] = []
        self._emit(Phase("connect"))

        def prepare(node: NodePlan) -> None:
            self._connect_node(node)
            connected.append(time.monotonic())
            self._push(node, manifest.result(), plan)

        def watch() -> None:
            if manifest.done() and manifest.exception() is not None:
                raise manifest.exception()
            if len(connected) == len(plan.nodes) and len(self._phases) == 0:
                self._phases.append(("connect", max(connected) - t0))
                self._emit(Phase("push"))

        try:
            self._fan_out("prepare", plan.nodes, prepare, watch=watch)
        except HostsFailed as exc:
            kinds = {"connect" if isinstance(e, ConnectError) else "push" for e in exc.failures.values()}
            raise HostsFailed(" and ".join(sorted(kinds, reverse=False)), exc.failures) from None
        watch()
        self._phases.append(("push", time.monotonic() - t0 - self._phases[0][1]))
        self.store.update_run(self.run_id, phases={n: round(s, 4) for n, s in self._phases})

    # -------------------------------------------------------------- fan-out

    def _fan_out(self, phase: str, nodes, fn: Callable[[NodePlan], object],
                 interruptible: bool = True, watch: Callable[[], None] = lambda: None) -> Dict[int, object]:
        """Run fn on every node in parallel; drain events meanwhile; raise one error naming every failure.

        Not interruptible: let calls in flight finish (a start that completes after we gave up on it would
        leave ranks running that nobody stops); the interrupt is acted on right after."""
        results: Dict[int, object] = {}
        failures: Dict[str, HostError] = {}
        pool = ThreadPoolExecutor(max_workers=min(64, max(1, len(nodes))), thread_name_prefix=phase)
        futures: Dict[Future, NodePlan] = {pool.submit(fn, n): n for n in nodes}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.05, return_when=FIRST_COMPLETED)
                self._drain()
                watch()
                if self._interrupts and interruptible:
                    raise Interrupted(phase)
                for fut in done:
                    node = futures[fut]
                    try:
                        results[node.node_rank] = fut.result()
                    except HostError as exc:
                        failures[node.host.name] = exc
                        self.store.update_host(self.run_id, node.node_rank, state=f"{phase}-failed", error=str(exc))
                    except Exception as exc:  # a bug or an unexpected library error: still name the host
                        failures[node.host.name] = RemoteCommandError(node.host.name, f"{phase}: {exc!r}")
            self._drain()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if failures:
            raise HostsFailed(phase, failures)
        return results

    def _post(self, event: object) -> None:
        """Progress from worker threads: advisory, so dropped rather than blocking when the queue is full
        (a pool thread stuck on a full queue would also hold up the interpreter's exit)."""
        try:
            self._q.put_nowait(event)
        except queue.Full:
            pass

    def _drain(self) -> None:
        while True:
            try:
                self._emit(self._q.get_nowait())
            except queue.Empty:
                return

    # -------------------------------------------------------------- per host

    def _agent(self, node_rank: int) -> HostAgent:
        with self._agents_lock:
            return self._agents[node_rank]

    def _reconnect(self, node_rank: int) -> HostAgent:
        host = self.inv.hosts[node_rank]
        agent = self._connect(host)
        with self._agents_lock:
            old, self._agents[node_rank] = self._agents.get(node_rank), agent
        if old is not None:
            old.close()
        return agent

    def _connect_node(self, node: NodePlan) -> HostAgent:
        t = time.monotonic()
        agent = self._connect(node.host)
        with self._agents_lock:
            if self._closing:  # the run was abandoned while this host was connecting
                agent.close()
                raise Interrupted("connect")
            self._agents[node.node_rank] = agent
        self._post(HostDone("connect", node.host.name, time.monotonic() - t))
        return agent

    def _push(self, node: NodePlan, manifest: Manifest, plan: LaunchPlan) -> None:
        t = time.monotonic()
        total = manifest.total_bytes
        sent = [0]

        def progress(n: int) -> None:
            sent[0] += n
            self._post(HostProgress("push", node.host.name, sent[0], total))

        self.store.update_host(self.run_id, node.node_rank, state="pushing")
        rank0 = node.node_rank == 0
        held = self._agent(node.node_rank).push(
            self.run_id, manifest, progress, want_port=rank0 and plan.master_port is None,
            check_port=plan.master_port if rank0 else None, master_addr=plan.master_addr)
        with self._agents_lock:
            self._held[node.node_rank] = held
        result = held.result
        self.store.update_host(self.run_id, node.node_rank, state="pushed", pushed_bytes=result.sent_bytes,
                               push_seconds=round(result.seconds, 4))
        self._post(HostDone("push", node.host.name, time.monotonic() - t,
                             f"{result.sent_bytes} of {total} bytes sent, {result.files} files"))

    def _spec(self, plan: LaunchPlan, node: NodePlan) -> dict:
        return {"run_id": plan.run_id, "grace": self.inv.timeouts.grace, "fail_fast": True,
                "time_limit": plan.time_limit_s,
                "ranks": [{"rank": r.rank, "argv": list(r.argv), "env": rank_env(plan, r, self._secrets)}
                          for r in node.ranks]}

    def _start_node(self, plan: LaunchPlan, node: NodePlan) -> None:
        t = time.monotonic()
        with self._agents_lock:
            held = self._held.pop(node.node_rank)
        state = held.start(self._spec(plan, node))
        with self._agents_lock:
            self._started.append(node.node_rank)
        pid = state.get("supervisor", {}).get("pid")
        self.store.update_host(self.run_id, node.node_rank, state="started", supervisor_pid=pid)
        self._post(HostDone("start", node.host.name, time.monotonic() - t))

    def _start_all(self, plan: LaunchPlan) -> None:
        """Rank 0's host first (it hosts the rendezvous), then every other host at once."""
        self._fan_out("start", plan.nodes[:1], lambda n: self._start_node(plan, n), interruptible=False)
        if self._interrupts:
            raise Interrupted("start")
        if len(plan.nodes) > 1:
            self._fan_out("start", plan.nodes[1:], lambda n: self._start_node(plan, n), interruptible=False)
        if self._interrupts and not self._detach:
            raise Interrupted("start")

    def _abandon_held(self) -> None:
        """Hosts that received the job but were not started remove it when their channel closes."""
        with self._agents_lock:
            held, self._held = list(self._held.values()), {}
        for h in held:
            h.abandon()

    def _undo(self, plan: LaunchPlan, grace: float) -> None:
        """Undo a launch that did not get to run: stop what started, drop what was only pushed."""
        self._abandon_held()
        with self._agents_lock:
            nodes = [n for n in plan.nodes if n.node_rank in self._started]
        if not nodes:
            return

        def stop(node: NodePlan) -> None:
            self._agent(node.node_rank).stop(plan.run_id, grace)
            self.store.update_host(self.run_id, node.node_rank, state="stopped", cleanup="done")

        self._interrupts.clear()  # a stop must run to its end even after Ctrl-C
        try:
            self._fan_out("stop", nodes, stop, interruptible=False)
        except HostsFailed as exc:
            for name in exc.failures:
                node = next(n for n in nodes if n.host.name == name)
                self.store.update_host(self.run_id, node.node_rank, cleanup="pending")
            self._emit(Notice(str(exc) + "\n`clusterrun stop` finishes them later.", "error"))
