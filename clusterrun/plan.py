"""Inventory → LaunchPlan: pure data for every rank (host, ranks, argv, env, remote paths).

Ranks follow torchrun's contract so scripts written for torchrun run unchanged, and get
`--rank i --world-size n` on the command line for scripts written the tutorials' way.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

from .errors import UsageError
from .config.inventory import Host, Inventory

# Variables clusterrun owns for every rank; an inventory env: that sets one would break the contract.
CONTRACT_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                "CLUSTERRUN_RUN_ID", "CLUSTERRUN_NODE_NAME", "CLUSTERRUN_DIST_URL", "CLUSTERRUN_DIST_BACKEND",
                "CLUSTERRUN_TIMEOUT")
SOFT_DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}  # ranks flush per line unless the user says otherwise
AUTO_PORT = "auto"
MASK = "***"


@dataclass(frozen=True)
class RankSpec:
    rank: int
    local_rank: int
    node_rank: int
    host_name: str
    argv: Tuple[str, ...]
    env: Mapping[str, str]  # what the plan sets on top of the host's login environment; no secrets


@dataclass(frozen=True)
class NodePlan:
    node_rank: int
    host: Host
    run_dir: str  # on the host; may start with ~ (expanded there)
    ranks: Tuple[RankSpec, ...]

    @property
    def job_dir(self) -> str:
        return f"{self.run_dir}/job"


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    world_size: int
    master_addr: str
    master_port: Optional[int]  # None until resolved when the inventory says auto
    init_url: str
    backend: str
    timeout_s: float
    time_limit_s: Optional[float]
    nodes: Tuple[NodePlan, ...]
    secret_names: Tuple[str, ...]

    @property
    def ranks(self) -> Tuple[RankSpec, ...]:
        return tuple(r for n in self.nodes for r in n.ranks)


def run_dir_for(host: Host, run_id: str) -> str:
    return f"{host.workdir.rstrip('/')}/runs/{run_id}"


def init_url(inv: Inventory, run_id: str, addr: str, port: str) -> str:
    method = inv.job.init_method
    if method == "env":
        return "env://"
    if method == "tcp":
        host = f"[{addr}]" if ":" in addr else addr
        return f"tcp://{host}:{port}"
    return f"file://{inv.job.shared_dir.rstrip('/')}/clusterrun-{run_id}.init"


def build_plan(inv: Inventory, run_id: str, *, master_port: Optional[int] = None) -> LaunchPlan:
    """Place ranks on hosts in list order (global rank = node order x slots) and fill in argv and env."""
    if inv.job.script is None:
        raise UsageError(f"{inv.path}: no job script; give one with --script PATH or job.script")
    for host in inv.hosts:
        taken = sorted(set(host.env) & set(CONTRACT_ENV))
        if taken:
            raise UsageError(f"{host.source}: env sets {', '.join(taken)}, which clusterrun sets for every rank")
    port = master_port if master_port is not None else inv.master_port
    port_text = str(port) if port is not None else AUTO_PORT
    world = sum(h.slots for h in inv.hosts)
    master_addr = inv.hosts[0].master_addr
    url = init_url(inv, run_id, master_addr, port_text)
    nodes = []
    rank = 0
    for node_rank, host in enumerate(inv.hosts):
        ranks = []
        for local_rank in range(host.slots):
            env: Dict[str, str] = {**SOFT_DEFAULT_ENV, **host.env}
            env.update({
                "RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(host.slots),
                "GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": str(len(inv.hosts)),
                "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world), "NODE_RANK": str(node_rank),
                "MASTER_ADDR": master_addr, "MASTER_PORT": port_text,
                "CLUSTERRUN_RUN_ID": run_id, "CLUSTERRUN_NODE_NAME": host.name,
                "CLUSTERRUN_DIST_URL": url, "CLUSTERRUN_DIST_BACKEND": inv.job.backend,
                "CLUSTERRUN_TIMEOUT": str(int(inv.job.timeout_s)),
            })
            argv = (host.python, inv.job.script, "--rank", str(rank), "--world-size", str(world)) + inv.job.args
            ranks.append(RankSpec(rank=rank, local_rank=local_rank, node_rank=node_rank, host_name=host.name,
                                  argv=argv, env=env))
            rank += 1
        nodes.append(NodePlan(node_rank=node_rank, host=host, run_dir=run_dir_for(host, run_id),
                              ranks=tuple(ranks)))
    return LaunchPlan(run_id=run_id, world_size=world, master_addr=master_addr, master_port=port,
                      init_url=url, backend=inv.job.backend, timeout_s=inv.job.timeout_s,
                      time_limit_s=inv.job.time_limit_s, nodes=tuple(nodes), secret_names=inv.secrets)


def rank_env(plan: LaunchPlan, rank: RankSpec, secrets: Mapping[str, str]) -> Dict[str, str]:
    """The full env a rank gets: the plan's plus the secrets' values (these go only into a 0600 file)."""
    return {**rank.env, **{name: secrets[name] for name in plan.secret_names}}


def render_rank_command(plan: LaunchPlan, node: NodePlan, rank: RankSpec) -> str:
    """What a rank runs, as one shell line a user could paste on that host (secrets masked)."""
    env = [f"{k}={v}" for k, v in rank.env.items()] + [f"{k}={MASK}" for k in plan.secret_names]
    return f"cd {shell_path(node.job_dir)} && " + shlex.join(["env", *env, *rank.argv])


def shell_path(path: str) -> str:
    """Quote a path for a POSIX shell but leave a leading ~/ to be expanded there."""
    return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def plan_to_dict(plan: LaunchPlan) -> dict:
    """A JSON-able form of the plan for the run record and --json (it never holds secret values)."""
    return {
        "run_id": plan.run_id, "world_size": plan.world_size, "master_addr": plan.master_addr,
        "master_port": plan.master_port, "init_url": plan.init_url, "backend": plan.backend,
        "timeout_s": plan.timeout_s, "time_limit_s": plan.time_limit_s, "secret_names": list(plan.secret_names),
        "nodes": [{"node_rank": n.node_rank, "name": n.host.name, "host": n.host.host,
                   "connection": n.host.connection, "run_dir": n.run_dir,
                   "ranks": [{"rank": r.rank, "local_rank": r.local_rank, "argv": list(r.argv),
                              "env": dict(r.env)} for r in n.ranks]} for n in plan.nodes],
    }
