"""One run, start to end: connect → push → start (every host at once) → follow → stop → result, and
while job.restarts allow after a failure, the next attempt (`_invoke_run`, as torch's elastic agent's:
the decisions are launch/restarts.py's, the verdicts outcome.py's).

The runner owns no terminal: it posts events to `emit` from its own (main) thread, which the CLI
renders. Host work fans out to threads; every phase reports all failed hosts at once.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..config.inventory import Host, Inventory, inventory_snapshot
from .. import outcome
from ..errors import ClusterrunError, HostsFailed
from ..events import HostDone, HostProgress, Notice, Phase, Waiting
from ..hosts.claims import WaitStatus
from ..hosts.client import HostClient
from ..hosts.group import GroupResult, background, fan_out
from ..hosts.relay import RelayGroup
from ..hosts.relay import for_push as relay_for_push
from ..hosts.manifest import HashCache, Manifest, build_manifest
from ..outcome import RunOutcome
from ..plan import LaunchPlan, NodePlan, build_plan, plan_to_dict, rank_rows, setup_request
from ..registry.store import RunStore, controller_identity
from ..states import Cleanup, HostState, RunState
from . import restarts
from .start import start_all, start_steps
from .job_setup import run_setup
from . import environment as job_env
from .job_outputs import pull_outputs
from .job_ports import PortForwards
from .claiming import LaunchClaims, prepare_failure, wait_mesh
from .gpu_gate import gate_for
from .hostset import Closed, HostSet
from .monitor import Monitor
from .preflight import checked_plan, preflight
from .spec import host_spec

Connect = Callable[[Host], HostClient]


class Interrupted(Exception):
    """Internal, not a ClusterrunError: Ctrl-C (or a stop) during a phase, raised in the runner and caught
    in `Runner.run`, which turns it into the run's outcome (outcome.interrupted); it never reaches a user."""


class Runner:
    def __init__(self, inv: Inventory, run_id: str, *, store: RunStore, connect: Connect,
                 secrets: Mapping[str, str], emit: Callable[[object], None], detach: bool = False,
                 hash_cache: Optional[HashCache] = None, checks: Callable = preflight, wait: bool = False,
                 wait_timeout: Optional[float] = None):
        self.inv = inv
        self.run_id = run_id
        self.store = store
        self._secrets = dict(secrets)
        self._emit = emit
        self._detach = detach
        self._hash_cache = hash_cache or HashCache(None)
        self._checks = checks
        # bounded: a slow terminal pushes back on the followers and the SSH window, never on the ranks
        self._q: "queue.Queue" = queue.Queue(maxsize=64)
        self.hosts = HostSet(connect)  # each host's connection, held push, follow stream
        self._lock = threading.Lock()
        self._interrupts: List[float] = []
        self._t0 = time.monotonic()
        self._phases: List[tuple] = []
        self.monitor: Optional[Monitor] = None
        self._peer_token = os.urandom(16).hex()  # the hosts' supervisors authenticate each other with it
        self._coordinator_port: Optional[int] = None
        self._plan: Optional[LaunchPlan] = None  # the attempt being launched or followed
        # claims on the hosts' slots and GPUs (claiming.py): one launch's place in line on every host
        self.claims = LaunchClaims(inv, run_id, wait=wait, wait_timeout=wait_timeout, detach=detach,
                                   on_wait=self._on_wait)
        self._handoff = False  # --detach --wait with a host busy: the hosts' waiters start it in its turn
        self._wait_port: Optional[int] = None  # where they meet (rank 0's host, bound during the push)
        self._network: Dict[int, dict] = {}  # by inventory index: the interface its push found (plan.net_choice)
        self._forwarding: Optional[PortForwards] = None  # job.ports, while an attached run lives
        self._wheels: Optional[job_env.Wheels] = None  # wheels: controller's, pushed with the job

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
                          controller_identity(), [{"node_rank": n.index, "name": n.host.name} for n in plan.nodes],
                          rank_rows(plan), restarts=self.inv.job.restarts)
        self._plan = plan
        try:
            # what to push is worked out while the connections are being made
            self._wheels = job_env.fetch_wheels(self.inv, plan, self._phase, self._fan_out, self._connect_node,
                                                self.store.home, self._emit)  # wheels: controller's, then pushed
            manifest = background(build_manifest, self.inv.job, self._hash_cache, self._wheels and self._wheels.files,
                                  thread_name="manifest")
            self._prepare(plan, manifest)
            plan = self._plan = self._preflight(plan)
            plan = self._plan = self._stacks(plan)
            if self.inv.job.setup:
                self._phase("setup", lambda: self._setup_all(plan, manifest.result()))
            self._handoff = self.claims.handed_off
            # --detach --wait with a host busy: the start hands the run to the hosts' waiters (queue)
            self._phase("queue" if self._handoff else "start", lambda: self._start_all(plan))
            if self._detach:
                # no controller from now on; who launched it stays on record (`stop` refuses anyone else)
                ident = controller_identity()
                self.store.update_run(self.run_id, state=RunState.WAITING if self._handoff else RunState.RUNNING,
                                      detached=1, controller={"host": ident["host"], "user": ident["user"]})
                return self._timed(outcome.queued(self.run_id) if self._handoff else outcome.detached(self.run_id))
            self.store.update_run(self.run_id, state=RunState.RUNNING)
            if self.inv.job.ports:
                self._forwarding = PortForwards(self.inv.job.ports, self._rank0_client, plan.nodes[0].host.name,
                                                self._emit, self._post)
            result = self._invoke_run(plan)
            self._stop_forwards()
            if self.inv.job.outputs:  # a failed run's too: its partial results are the evidence
                seen = len(self._interrupts)
                pull_outputs(self.store, self.run_id, result, self._rank0_client, emit=self._emit, post=self._post,
                             drain=self._drain, stopped=lambda: len(self._interrupts) > seen)
            return replace(result, phases=tuple(self._phases) + (("run", result.seconds),), seconds=self._elapsed())
        except Interrupted:
            self._undo(self._plan, grace=0.0 if self.force_requested else self.inv.timeouts.grace)
            return self._conclude(outcome.interrupted(self.run_id))
        except ClusterrunError as exc:  # hosts failed, or a bad job file found while connecting
            self._undo(self._plan, grace=0.0)
            self._conclude(outcome.launch_failed(self.run_id, exc))
            raise
        finally:
            self._stop_forwards()
            self.claims.abort()  # a push thread still waiting in line stops waiting
            self.hosts.close()

    # -------------------------------------------------------------- around the run: ports, outputs

    def _rank0_client(self) -> HostClient:
        """The connection to rank 0's host of the attempt being run (restarts may move rank 0)."""
        return self._client(self._plan.nodes[0].index)

    def _stop_forwards(self) -> None:
        if self._forwarding is not None:
            forwarding, self._forwarding = self._forwarding, None
            forwarding.stop()

    # -------------------------------------------------------------- attempts

    def _invoke_run(self, plan: LaunchPlan) -> RunOutcome:
        """Follow attempts until one ends the run: after a failure, while job.restarts allow, the next one
        on the hosts still there (launch/restarts.py decides). The run's outcome is the last attempt's,
        listing every attempt."""
        summaries: List[outcome.AttemptSummary] = []
        dropped: Tuple[str, ...] = ()
        result = self._follow(plan)
        while True:
            summaries.append(restarts.summary(plan, result, dropped))
            nxt, why = restarts.next_attempt(self.inv, plan, result, self._elapsed())
            if nxt is None:
                if why:
                    self._emit(Notice(why, "error"))
                break
            self.store.attempts.archive(self.store.get(self.run_id), dropped)
            self.store.reopen(self.run_id)  # running again: `clean` leaves it be
            self._emit(Notice(restarts.announcement(nxt, self.inv), "warning"))
            if not self._wait_delay(self.inv.job.restart_delay_s):
                result = self._conclude(outcome.interrupted(
                    self.run_id, f"interrupted by the user (Ctrl-C) before attempt {nxt.attempt + 1} started"))
                break
            dropped = nxt.dropped
            plan, result = self._next_attempt(nxt)
        return outcome.with_attempts(result, summaries)

    def _follow(self, plan: LaunchPlan) -> RunOutcome:
        """Watch one attempt to its end (launch/monitor.py), on a queue of its own: what the last attempt's
        threads still post (a lost host's stop ending late) never reaches the next one."""
        if plan.attempt:
            self._q = queue.Queue(maxsize=64)
        self.monitor = Monitor(plan, self.store, streams=self.hosts.take_streams(),
                               client=lambda node_rank: self._client(plan.nodes[node_rank].index),
                               reconnect=lambda node_rank: self._reconnect(plan.nodes[node_rank].index),
                               emit=self._emit, events=self._q, timeouts=self.inv.timeouts, t0=self._t0,
                               restarts_allowed=self.inv.job.restarts, inventory=self.inv.path)
        if self._interrupts:
            self.monitor.interrupt(force=self.force_requested)
        return self.monitor.run()

    def _next_attempt(self, nxt: restarts.NextAttempt) -> Tuple[LaunchPlan, RunOutcome]:
        """Start attempt K over the hosts still there (rank 0's host first) and follow it; a host that
        cannot be started makes this attempt a failure with that host lost."""
        t = time.monotonic()
        self._emit(Phase("start", f"attempt {nxt.attempt + 1}"))
        plan = self._plan = restarts.attempt_plan(self.inv, self.run_id, nxt, lambda i: self._client(i).free_port(),
                                                  self._network)
        with self.store.batch():
            self.store.begin_attempt(self.run_id, plan.attempt, plan_to_dict(plan), rank_rows(plan))
            for node in plan.nodes:
                self.store.update_host(self.run_id, node.index, state=HostState.PENDING, error=None)
        self._emit(Notice(f"MASTER_ADDR={plan.master_addr} MASTER_PORT={plan.master_port} "
                          f"(world size {plan.world_size})"))
        self.hosts.new_attempt()
        self._coordinator_port = None  # the new rank 0's host coordinates this attempt's supervisors
        try:
            self._start_all(plan)
        except HostsFailed as exc:
            self._emit(Notice(str(exc), "error"))
            self._undo(plan, grace=0.0)
            return plan, self._conclude(outcome.attempt_not_started(self.run_id, plan.ranks, exc))
        self._phases.append((f"restart {plan.attempt}", time.monotonic() - t))
        self.store.update_run(self.run_id, state=RunState.RUNNING)
        return plan, self._follow(plan)

    def _wait_delay(self, seconds: float) -> bool:
        """Sleep the restart delay; False as soon as the user interrupts (no restart then)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._interrupts:
                return False
            time.sleep(0.05)
        return not self._interrupts

    def _preflight(self, plan: LaunchPlan) -> LaunchPlan:
        """The cheap checks, then the plan with the master port and interfaces the pushes found."""
        plan, self._network = checked_plan(self.inv, self.run_id, plan, self.hosts.all_held(), self._checks,
                                           self._emit)
        self._plan = plan
        self.store.update_run(self.run_id, plan=plan_to_dict(plan))
        return plan

    def _stacks(self, plan: LaunchPlan) -> LaunchPlan:
        """job.environment's venv on every host, or the plain pythons' fingerprints: compared (environment.py)."""
        steps = job_env.Steps(self.inv, plan, self.hosts.held, self._fan_out,
                              log_copy=lambda host: self.store.aux_log_path(plan.run_id, host, "environment"),
                              lines=self._q.put, wheels=self._wheels)
        self.inv, plan = job_env.settle(self.inv, plan, steps, self.store, self._phase, self._network)
        return plan

    def _setup_all(self, plan: LaunchPlan, manifest: Manifest) -> None:
        """job.setup on every host at once, output streamed as `[host setup]`; any failure stops the launch
        before a rank starts (every failing host named)."""
        self._fan_out("setup", plan.nodes, lambda node: self._setup_node(plan, node, manifest), interruptible=True)

    def _setup_node(self, plan: LaunchPlan, node: NodePlan, manifest: Manifest) -> None:
        run_setup(self.hosts.held(node.node_rank), setup_request(self.inv, plan, node, manifest.wire(), self._secrets), node.host.name,
                  node.node_rank, copy=self.store.aux_log_path(plan.run_id, node.host.name, "setup"),
                  timeouts=self.inv.timeouts, lines=self._q.put, post=self._post)

    def _conclude(self, result: RunOutcome) -> RunOutcome:
        """Record an end the launch itself came to (outcome.py's verdict), with the phases so far."""
        self.store.conclude(result)
        return self._timed(result)

    def _timed(self, result: RunOutcome) -> RunOutcome:
        return replace(result, seconds=self._elapsed(), phases=tuple(self._phases))

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _phase(self, name: str, body: Callable[[], Any]) -> Any:
        t = time.monotonic()
        self._emit(Phase(name))
        result = body()
        self._phases.append((name, time.monotonic() - t))
        self.store.update_run(self.run_id, phases={n: round(s, 4) for n, s in self._phases})
        return result

    def _prepare(self, plan: LaunchPlan, manifest: "Future[Manifest]") -> None:
        """Connect to every host and push to each as soon as it is connected: no barrier between the two,
        so a slow host delays only itself. Phases: connect (until the last host is connected), push."""
        t0 = time.monotonic()
        connected: List[float] = []
        self._emit(Phase("connect"))

        relay = relay_for_push(self.inv.relay, len(plan.nodes), self.inv.timeouts)  # hosts pass the push on
        claims = self.claims.begin(plan)
        gate = gate_for(self.inv, plan.nodes, self._post, plan.run_id) if plan.attempt == 0 else None
        announced: List[bool] = []

        def prepare(node: NodePlan) -> None:
            try:
                client = self._connect_node(node)
            except BaseException as exc:
                if relay is not None:  # never arrives: the other hosts stop waiting for it
                    relay.fail(node.node_rank)
                if claims is not None:
                    claims.fail(0, f"{node.host.name}: {exc}")
                if gate is not None:
                    gate.fail(node.index)
                raise
            connected.append(time.monotonic())
            if gate is not None and not gate.passes(node, client, self.claims, relay, claims):
                return  # another host's GPUs failed: nothing is pushed anywhere
            self._push(node, manifest.result(), plan, relay if relay is not None and
                       relay.pays(manifest.result()) else None)

        def watch() -> None:
            if manifest.done() and manifest.exception() is not None:
                raise manifest.exception()
            if len(connected) == len(plan.nodes) and not any(n == "connect" for n, _ in self._phases):
                self._phases.append(("connect", max(connected) - t0))
                self._emit(Phase("push"))
            if claims is not None and claims.wait_seconds and self.claims.waited and not announced:
                announced.append(True)  # its turn came: the push proper starts now
                self._drain()
                self._emit(Phase("push", f"after waiting {claims.wait_seconds:.0f} s"))

        try:
            self._fan_out("prepare", plan.nodes, prepare, watch=watch)
        except HostsFailed as exc:
            raise prepare_failure(exc, self.claims) from None
        watch()
        waited = self.claims.wait_seconds
        if waited:  # launch --wait: the time in line is not the push's
            self._phases.append(("wait", waited))
        self._phases.append(("push", time.monotonic() - t0 - dict(self._phases)["connect"] - waited))
        self.store.update_run(self.run_id, phases={n: round(s, 4) for n, s in self._phases})

    def _on_wait(self, status: WaitStatus, first: bool) -> None:
        """From a push thread: the launch's place in line changed."""
        if first:
            self.store.update_run(self.run_id, state=RunState.WAITING)
            self._post(Phase("wait"))
        self._post(Waiting(status))

    # -------------------------------------------------------------- fan-out

    def _fan_out(self, phase: str, nodes, fn: Callable[[NodePlan], object], interruptible: bool = True,
                 watch: Callable[[], None] = lambda: None) -> GroupResult:
        """fn on every node in parallel (hosts.group); drain events meanwhile; raise one error naming every
        host that failed.

        Not interruptible: let calls in flight finish (a start that completes after we gave up on it would
        leave ranks running that nobody stops); the interrupt is acted on right after."""
        def poll() -> None:
            self._drain()
            watch()
            if self._interrupts and interruptible:
                raise Interrupted(phase)

        result = fan_out(nodes, fn, name=lambda n: n.host.name, poll=poll, thread_name=phase)
        self._drain()
        index_of = {n.host.name: n.index for n in nodes}
        for name, exc in result.errors.items():
            self.store.update_host(self.run_id, index_of[name], state=HostState.failed_in(phase), error=str(exc))
        result.raise_for(phase)
        return result

    def _post(self, event: object) -> None:
        """Progress from worker threads: advisory, so dropped rather than blocking when the queue is full
        (a pool thread stuck on a full queue would also hold up the interpreter's exit)."""
        try:
            self._q.put_nowait(event)
        except queue.Full:
            pass

    def _drain(self) -> None:
        self.store.flush()  # the rows the hosts' threads left (update_host_later), all in one commit
        while True:
            try:
                self._emit(self._q.get_nowait())
            except queue.Empty:
                return

    # -------------------------------------------------------------- per host

    def _client(self, index: int) -> HostClient:
        """The connection to the host at this place in the inventory (its node rank may change: restarts)."""
        return self.hosts.client(index)

    def _reconnect(self, index: int) -> HostClient:
        return self.hosts.connect(index, self.inv.hosts[index])

    def _connect_node(self, node: NodePlan) -> HostClient:
        t = time.monotonic()
        if (known := self.hosts.existing(node.index)) is not None:  # connected already (wheels: controller)
            return known
        try:
            client = self.hosts.connect(node.index, node.host)
        except Closed:  # the run was abandoned while this host was connecting
            raise Interrupted("connect") from None
        self._post(HostDone("connect", node.host.name, time.monotonic() - t))
        return client

    def _push(self, node: NodePlan, manifest: Manifest, plan: LaunchPlan, relay: Optional[RelayGroup]) -> None:
        t = time.monotonic()
        total = manifest.total_bytes
        sent = [0]

        def progress(n: int) -> None:
            sent[0] += n
            self._post(HostProgress("push", node.host.name, sent[0], total))

        self.store.update_host_later(self.run_id, node.index, state=HostState.PUSHING)
        rank0 = node.node_rank == 0
        base = job_env.env_base(self.inv, node.host)  # the host describes it in its facts (or says it lacks it)
        env_base = {"env_base": base} if base else {}
        held = self._client(node.index).push(
            self.run_id, manifest, progress, want_port=rank0 and plan.master_port is None,
            check_port=plan.master_port if rank0 else None, master_addr=plan.master_addr,
            relay=(relay, node.node_rank) if relay is not None else None, coordinator=rank0 and len(plan.nodes) > 1,
            claim=self.claims.of(plan, node), fingerprint=self.inv.job.environment is None, **env_base)
        if self.claims.waited:
            self.store.update_run(self.run_id, state=RunState.STARTING)
        self.hosts.hold(node.node_rank, held)
        self.claims.took(node.index, held.claim)
        with self._lock:
            if rank0:  # every host can be started at once: rank 0's host already listens for the others
                self._coordinator_port = held.coordinator_port
                self._wait_port = held.wait_port
        result = held.result
        self.store.update_host_later(self.run_id, node.index, state=HostState.PUSHED, pushed_bytes=result.sent_bytes,
                               push_seconds=round(result.seconds, 4), relayed_bytes=result.relayed,
                               push_detail=json.dumps(result.timing) if result.timing else None)
        waited = self.claims.wait_seconds  # its time in line is not the push's
        self._post(HostDone("push", node.host.name, time.monotonic() - t - waited, sent=result.sent_bytes, total=total,
                             relayed=result.relayed, files=result.files))
        for note in result.relay_notes:
            self._post(Notice(f"{node.host.name}: relay push: {note}; the rest came directly", "warning"))
        if result.repaired:
            self._post(Notice(f"{node.host.name}: {result.repaired} cached file(s) had changed since they were "
                              "pushed (a job writing to its pushed files?): sent again", "warning"))

    def _spec(self, plan: LaunchPlan, node: NodePlan) -> dict:
        left = None if plan.time_limit_s is None else max(1.0, plan.time_limit_s - self._elapsed())
        return host_spec(self.inv, plan, node, self._secrets, time_left=left, peer_token=self._peer_token,
                         coordinator_port=self._coordinator_port, detached=self._detach,
                         gpus=self.claims.gpus_of(node.index), claim=self.claims.for_start(plan, node))

    def _start_node(self, plan: LaunchPlan, node: NodePlan) -> None:
        t = time.monotonic()
        if plan.attempt == 0 and self._handoff:  # --detach --wait: its waiter starts it in its turn
            held = self.hosts.take_held(node.node_rank)
            wait_timeout = self.claims.wait_timeout
            left = None if wait_timeout is None else max(1.0, wait_timeout - self._elapsed())
            held.wait(self._spec(plan, node), wait_mesh(self.inv, plan, node, token=self._peer_token,
                                                        port=self._wait_port, timeout=left))
            self._post(HostDone("queue", node.host.name, time.monotonic() - t))
            return
        if plan.attempt == 0:  # on the channel that pushed the job, which then follows the run (attached)
            held = self.hosts.take_held(node.node_rank)
            if self._detach:
                state = held.start(self._spec(plan, node))
            else:
                state, stream = held.start_following(self._spec(plan, node))
                self.hosts.following(node.node_rank, stream)
        else:  # a restart: the job is there already, the attempt gets a folder of its own
            state = self._client(node.index).start(plan.attempt_key, self._spec(plan, node))
        if node.node_rank == 0 and plan.attempt:  # the other hosts' supervisors join rank 0's (peers.py)
            self._coordinator_port = (state.get("coordinator") or {}).get("port")
        self.hosts.started(node.node_rank)
        pid = state.get("supervisor", {}).get("pid")
        self.store.update_host_later(self.run_id, node.index, state=HostState.STARTED, supervisor_pid=pid)
        self._post(HostDone("start", node.host.name, time.monotonic() - t))

    def _start_all(self, plan: LaunchPlan) -> None:
        """In job.start's order (launch/start.py): every host at once, or host after host in rank order."""
        # --detach --wait with a host busy: each host's waiter starts it in its turn, so no order to keep
        ordered = plan if not (plan.attempt == 0 and self._handoff) else replace(plan, start_order="all")
        steps = start_steps(ordered, coordinator_ready=plan.attempt == 0 and bool(self._coordinator_port))
        done = start_all(ordered, steps, lambda nodes: self._fan_out("start", nodes, lambda n: self._start_node(plan, n),
                                                                   interruptible=False),
                         stopped=lambda: bool(self._interrupts), emit=self._emit)
        if not done or (self._interrupts and not self._detach):
            raise Interrupted("start")

    def _undo(self, plan: LaunchPlan, grace: float) -> None:
        """Undo a launch that did not get to run: stop what started, drop what was only pushed."""
        self.hosts.abandon_held()
        started = self.hosts.started_ones()
        nodes = [n for n in plan.nodes if n.node_rank in started]
        if not nodes:
            return

        def stop(node: NodePlan) -> None:
            self._client(node.index).stop(plan.attempt_key, grace)
            self.store.update_host(self.run_id, node.index, state=HostState.STOPPED, cleanup=Cleanup.DONE)

        self._interrupts.clear()  # a stop must run to its end even after Ctrl-C
        try:
            self._fan_out("stop", nodes, stop, interruptible=False)
        except HostsFailed as exc:
            for node in nodes:
                if node.host.name in exc.failures:
                    self.store.update_host(self.run_id, node.index, cleanup=Cleanup.PENDING)
            self._emit(Notice(str(exc) + "\n`clusterrun stop` finishes them later.", "error"))
