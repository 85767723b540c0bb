"""Launch's GPU preflight: before any byte is pushed, every host whose run uses GPUs runs `gpu-check`
(remote/host/share/gpu_health.py) right after it is connected, and waits here for the other hosts'
answers, because some verdicts compare hosts (the driver, a slow GPU). Then, on each host:

- every GPU passes (warnings said once): the push goes on with the GPUs `gpus:` gives;
- a GPU fails and `gpus:` has enough other GPUs (auto, or more indices than ranks): the run leaves it
  out (the claim chooses among the healthy ones; without claims they are the ranks' CUDA_VISIBLE_DEVICES),
  and says which GPU was skipped and why;
- else the host raises GpuCheckFailed (exit 6) naming the host, the GPU and what failed; every other
  host stops before its push, so nothing is pushed or started anywhere.

A host whose `gpu-check` gave no answer (the host program hung, the connection dropped) fails closed.
`gpu_check: false` (a host, or `defaults:`) or `--no-gpu-check` (every host) skips it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, Tuple, Union

from ..check.gpu_rules import (FAIL, OK, HostGpus, gpu_request, gpu_result, judge_host, judge_peers, request_seconds,
                               usable)
from ..config.inventory import Inventory
from ..errors import GpuCheckFailed, HostError
from ..events import Notice
from ..plan import NodePlan

if TYPE_CHECKING:
    from ..hosts.client import HostClient
    from ..hosts.relay import RelayGroup
    from .claiming import ClaimGroup, LaunchClaims

WAIT_EXTRA_S = 30.0  # past the slowest host's own deadline: the others stop waiting for it


class GpuGate:
    """Where the GPU hosts' answers meet (see the module docstring); one per launch."""

    def __init__(self, inv: Inventory, nodes: Sequence[NodePlan], post: Callable[[object], None], run_id: str = ""):
        self.requests: Dict[int, dict] = {}
        for node in nodes:
            request = gpu_request(node.host, inv.timeouts.command, run_id)
            if request is not None:
                self.requests[node.index] = request
        self._names = {n.index: n.host.name for n in nodes}
        self._counts = {n.index: len(n.ranks) for n in nodes}
        self._post = post
        self._answers: Dict[int, Union[dict, HostError]] = {}
        self._gone: set = set()
        self._verdicts: Optional[Dict[str, HostGpus]] = None
        self._cond = threading.Condition()
        self._wait_s = max((request_seconds(r) for r in self.requests.values()), default=0.0) + WAIT_EXTRA_S

    def wants(self, index: int) -> bool:
        return index in self.requests

    @property
    def blocked(self) -> bool:
        """A host's GPUs failed and cannot be avoided: no host pushes."""
        with self._cond:
            return bool(self._verdicts) and any(self._blocking(v) for v in self._verdicts.values())

    def fail(self, index: int) -> None:
        """This host will never answer (its connection failed): nobody waits for it."""
        with self._cond:
            self._gone.add(index)
            self._cond.notify_all()

    def check(self, node: NodePlan, gpu_check: Callable[[dict, float], dict]) -> Optional[Tuple[int, ...]]:
        """Run node's check (gpu_check: its client's), wait for every other GPU host, then judge: the GPUs
        its run may use instead of those `gpus:` gives (None: as planned). GpuCheckFailed where it cannot
        go; the notices of warnings and skipped GPUs are posted."""
        request = self.requests[node.index]
        try:
            answer: Union[dict, HostError] = gpu_check(request, request_seconds(request))
        except HostError as exc:
            answer = exc
        with self._cond:
            self._answers[node.index] = answer
            self._cond.notify_all()
            while not self._all_in():
                if not self._cond.wait(self._wait_s):
                    break  # a host that never answers must not hold the others for ever
            if self._verdicts is None:
                self._verdicts = self._judge()
            verdict = self._verdicts[node.host.name]
        return self._decide(node, verdict)

    def wait(self) -> None:
        """A host that checks no GPU: wait for the verdicts (its push must not go ahead of a refusal)."""
        with self._cond:
            while not self._all_in():
                if not self._cond.wait(self._wait_s):
                    break
            if self._verdicts is None:
                self._verdicts = self._judge()

    def passes(self, node: NodePlan, client: "HostClient", launch_claims: "LaunchClaims",
               relay: Optional["RelayGroup"], claims: Optional["ClaimGroup"]) -> bool:
        """The GPU preflight on this host, the others' met: whether its push goes on. A GPU left out goes
        to the launch's claims (launch_claims.avoid); a refusal tells the relay and the claim group, so
        no other host waits for this one."""
        try:
            if self.wants(node.index):
                instead = self.check(node, client.gpu_check)
                if instead is not None:
                    launch_claims.avoid(node.index, instead, len(node.ranks))
            else:
                self.wait()
        except GpuCheckFailed:
            if claims is not None:
                claims.fail(0, f"{node.host.name}: GPU preflight failed")
            if relay is not None:
                relay.fail(node.node_rank)
            raise
        if self.blocked and relay is not None:
            relay.fail(node.node_rank)
        return not self.blocked

    def _all_in(self) -> bool:
        return all(i in self._answers or i in self._gone for i in self.requests)

    def _judge(self) -> Dict[str, HostGpus]:
        hosts = {}
        for index, answer in self._answers.items():
            name = self._names[index]
            if isinstance(answer, HostError):
                hosts[name] = HostGpus(name, failures=(f"gpu-check gave no answer: {answer.reason}: {answer.message}",))
            else:
                hosts[name] = judge_host(name, self.requests[index]["gpus"], answer)
        for index in self.requests:
            name = self._names[index]
            if index not in self._answers and index not in self._gone:
                hosts[name] = HostGpus(name, failures=("gpu-check did not answer in time",))
        judged, notes = judge_peers(hosts)
        for note in notes:
            self._post(Notice(f"GPU preflight: {note}", "warning"))
        return judged

    def _blocking(self, h: HostGpus) -> bool:
        index = next(i for i, n in self._names.items() if n == h.host)
        return h.status == FAIL and usable(h, self.requests[index]["gpus"], self._count(index)) is None

    def _count(self, index: int) -> int:
        return self._counts[index]

    def _decide(self, node: NodePlan, h: HostGpus) -> Optional[Tuple[int, ...]]:
        for text in h.warned():
            self._post(Notice(f"GPU preflight: {text}", "warning"))
        if h.status == OK:  # one line of evidence per host (what was not checked in it)
            self._post(Notice(f"GPU preflight: {h.host}: {gpu_result(h).detail}", "info"))
        elif h.notes:
            self._post(Notice(f"GPU preflight: {h.host}: {'; '.join(h.notes)}", "info"))
        if h.status != FAIL:
            return None
        instead = usable(h, self.requests[node.index]["gpus"], self._count(node.index))
        if instead is None:
            raise GpuCheckFailed(node.host.name, "; ".join(h.failing()), hint=_hint(h, node))
        for g in h.gpus:
            if g.status == FAIL:
                self._post(Notice(f"GPU preflight: {h.host} GPU {g.index} skipped: {'; '.join(g.failures)}; the run "
                                  f"uses GPUs {','.join(map(str, instead))} there", "warning"))
        return instead


def _hint(h: HostGpus, node: NodePlan) -> str:
    healthy = [g.index for g in h.gpus if g.status != FAIL]
    if h.failures:
        return "fix the host's driver or nvidia-smi, or skip the check: gpu_check: false for this host " \
               "(or --no-gpu-check)"
    return (f"only {len(healthy)} healthy GPU{'s' if len(healthy) != 1 else ''} ({','.join(map(str, healthy)) or 'none'}) "
            f"for {len(node.ranks)} rank{'s' if len(node.ranks) != 1 else ''}: list healthy GPUs in gpus: or lower "
            "slots:; --no-gpu-check skips the check")


def gate_for(inv: Inventory, nodes: Sequence[NodePlan], post: Callable[[object], None],
             run_id: str = "") -> Optional[GpuGate]:
    """The launch's gate, None where no host's run uses GPUs or every host skips the check."""
    gate = GpuGate(inv, nodes, post, run_id)
    return gate if gate.requests else None
