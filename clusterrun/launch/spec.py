"""What a host's start gets (pure): its ranks' argv and env, the grace, the time left, and how its
supervisor joins the others (remote/host/run/peers.py). Secret values go in here and only here, on their
way to the host's 0600 spec file."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ..config.inventory import Inventory
from ..plan import GPU_ENV, PER_WORKER_ENV, LaunchPlan, NodePlan, rank_env


def host_spec(inv: Inventory, plan: LaunchPlan, node: NodePlan, secrets: Mapping[str, str], *,
              time_left: Optional[float], peer_token: str, coordinator_port: Optional[int],
              detached: bool = False, gpus: Optional[Sequence[int]] = None, claim: Optional[dict] = None) -> dict:
    """gpus: the ones the host's claim took (its ranks see them, in local-rank order, as
    CUDA_VISIBLE_DEVICES); claim: what the supervisor adopts (launch/claiming.start_claim)."""
    extra = {GPU_ENV: ",".join(str(i) for i in gpus)} if gpus else {}
    spec = {"attempt_key": plan.attempt_key, "run_id": plan.run_id, "node_rank": node.node_rank, "node": node.host.name,
            "grace": inv.timeouts.grace, "fail_fast": True, "time_limit": time_left,
            "hang_timeout": inv.job.hang_timeout_s,
            "uses_gpus": node.host.gpus is not None,  # a hung run's hang.json holds the GPUs' state then
            "secret_names": list(plan.secret_names),
            "peers": peers(inv, plan, node, peer_token, coordinator_port),
            "ranks": [{"rank": r.rank, "argv": list(r.argv), "env": {**rank_env(plan, r, secrets), **extra}}
                      for r in node.ranks]}
    if node.torchrun:  # one torchrun for the host; the ranks are the ones expected here
        values = {name: secrets[name] for name in plan.secret_names}
        spec.update({"launcher": "torchrun", "command": list(node.torchrun), "entry": list(node.entry),
                     "env": {**node.env, **values, **extra}, "ranks": [{"rank": r.rank} for r in node.ranks]})
    if plan.start_order == "rank" and len(node.ranks) > 1:  # its ranks one after another (launch/start.py)
        spec["start_gap"] = plan.start_gap_s
    if claim is not None:
        spec["claim"] = claim
    if inv.job.outputs and node.node_rank == 0:  # the host's `runs` says whether they selected anything
        spec["outputs"] = list(inv.job.outputs)
    if inv.notify and node.node_rank == 0:
        spec["notify"] = notify_conf(inv, plan, node, detached)
    return spec


def notify_conf(inv: Inventory, plan: LaunchPlan, node: NodePlan, detached: bool) -> dict:
    """What rank 0's host's supervisor runs when the run ends (remote/host/run/notify.py). Its env holds no
    secret values: the host takes them from the ranks' env, which the scrub clears from spec.json."""
    first = node.ranks[0].env if node.ranks else {}
    env = {k: v for k, v in first.items() if k not in PER_WORKER_ENV and k not in plan.secret_names}
    env.update({"CLUSTERRUN_PYTHON": node.host.python})
    # restarts are the controller's: a detached run (or one whose controller died) makes no new attempt
    left = 0 if detached else max(0, inv.job.restarts - plan.attempt)
    return {"commands": list(inv.notify), "timeout": inv.timeouts.notify, "env": env, "attempt": plan.attempt + 1,
            "restarts_left": left, "time_limit_s": inv.job.time_limit_s}


def peers(inv: Inventory, plan: LaunchPlan, node: NodePlan, token: str, coordinator_port: Optional[int]) -> dict:
    """How this host's supervisor keeps the run's promises with the others when no controller watches:
    rank 0's coordinates (its answer to the start names its port), the others join it."""
    if len(plan.nodes) < 2:
        return {}
    t = inv.timeouts
    # each end checks the other proves the token; the coordinator lets in only the run's hosts' addresses,
    # and each supervisor binds (listens or connects from) its own
    common = {"token": token, "host_lost": t.host_lost, "join_timeout": t.command + t.host_lost,
              "run": plan.attempt_key, "bind": node.host.master_addr,
              "names": {str(n.node_rank): n.host.name for n in plan.nodes}}  # words of a peer's end, as ps says
    if node.node_rank == 0:
        return {**common, "coordinator": True, "expect": [n.node_rank for n in plan.nodes[1:]],
                "allow": sorted({n.host.master_addr for n in plan.nodes})}
    if coordinator_port is None:
        return {}
    return {**common, "addr": plan.master_addr, "port": coordinator_port}
