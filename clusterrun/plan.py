"""Inventory → LaunchPlan: pure data for every rank (host, ranks, argv, env, remote paths).

Three ways to start a job, for the three kinds of scripts people have:
- launcher python, rank_flags true (the tutorials' way): `python SCRIPT --rank i --world-size n ARGS`;
- launcher python, rank_flags false (scripts written for torchrun): `python SCRIPT ARGS`, the rank in the
  environment only (torchrun's contract: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...);
- launcher torchrun: one `python -m torch.distributed.run` per host, which starts the host's workers.
Placeholders in args and env values ({rank}, {dist_url}, ...) are rendered here, per rank (per host
under torchrun). The interface torch uses (network.ifname) is decided here too, from what each host's
push found (remote/host/net/ifaces.py): GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, where env: leaves them.
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import UsageError
from .config import placeholders
from .config.inventory import Host, Inventory

# Variables clusterrun owns for every rank; an inventory env: that sets one would break the contract.
CONTRACT_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                "CLUSTERRUN_RUN_ID", "CLUSTERRUN_NODE_NAME", "CLUSTERRUN_DIST_URL", "CLUSTERRUN_DIST_BACKEND",
                "CLUSTERRUN_TIMEOUT", "CLUSTERRUN_ATTEMPT", "TORCHELASTIC_RESTART_COUNT", "CLUSTERRUN_CHECKPOINT_DIR")
# What torchrun sets for each worker itself (with the ranks its rendezvous gave): not ours to set there.
PER_WORKER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")
SOFT_DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}  # ranks flush per line unless the user says otherwise
# NCCL's Flight Recorder (backend nccl): every rank keeps its last collectives, dumps them into the run
# folder on a watchdog timeout (and when its pipe is written: the hang watch asks that way), each in both
# spellings torch has had (TORCH_NCCL_* became aliases of TORCH_FR_*); a pair the job's env: names is left
# to it. The dumps' format and how clusterrun reads them: remote/host/run/flight.py.
FR_BUFFER = "2000"
FR_PREFIX = "nccl_trace_rank_"  # + the global rank: torch's default name, in the run folder instead of /tmp
FR_PIPE_PREFIX = "nccl_trace_pipe_rank_"  # + the rank + ".pipe": torch makes the FIFO, a write asks for a dump


def flight_recorder_env(backend: str, run_dir: str, env: Mapping[str, str]) -> Dict[str, str]:
    """The Flight Recorder's variables for a rank, where the job's env leaves them (empty with gloo)."""
    if backend != "nccl":
        return {}
    pairs = ((("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), FR_BUFFER),
             (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), f"{run_dir}/{FR_PREFIX}"),
             (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
             (("TORCH_NCCL_DEBUG_INFO_PIPE_FILE",), f"{run_dir}/{FR_PIPE_PREFIX}"))
    return {name: value for names, value in pairs if not any(n in env for n in names) for name in names}
TORCHRUN = ("-m", "torch.distributed.run")
AUTO_PORT = "auto"
IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # what network.ifname sets, unless env: does
MASK = "***"
GPU_ENV = "CUDA_VISIBLE_DEVICES"  # set to the GPUs the host's ranks claimed, in local-rank order


@dataclass(frozen=True)
class RankSpec:
    rank: int
    local_rank: int
    node_rank: int
    host_name: str
    argv: Tuple[str, ...]
    env: Mapping[str, str]  # what the plan sets on top of the host's login environment; no secrets


@dataclass(frozen=True)
class NetChoice:
    """The interface a host's ranks use (network.ifname), and why."""

    mode: str  # the inventory's network.ifname for this host: auto | none | an interface name
    ifname: Optional[str]  # what clusterrun sets IFNAME_ENV to (None: it sets nothing)
    why: str
    env: Tuple[str, ...] = ()  # the variables clusterrun sets (those env: does not)
    addrs: Tuple[Tuple[str, str], ...] = ()  # (interface, address) of the host's, as its push reported them
    mtu: Optional[int] = None  # of the chosen interface, where known

    def to_json(self) -> dict:
        return {"mode": self.mode, "ifname": self.ifname, "why": self.why, "env": list(self.env), "mtu": self.mtu}


@dataclass(frozen=True)
class NodePlan:
    node_rank: int  # this host's place in this attempt's world (node order of the hosts taking part)
    host: Host
    run_dir: str  # on the host; may start with ~ (expanded there)
    ranks: Tuple[RankSpec, ...]  # under torchrun: the ranks expected here; its rendezvous decides
    torchrun: Tuple[str, ...] = ()  # launcher torchrun: `python -m torch.distributed.run` and its options
    entry: Tuple[str, ...] = ()  # launcher torchrun: what each worker runs (script or -m module, args)
    env: Mapping[str, str] = field(default_factory=dict)  # launcher torchrun: the env torchrun gets
    index: int = -1  # the host's place in the inventory (its node rank in attempt 0)
    gpus: Union[None, str, Tuple[int, ...]] = None  # the GPUs its ranks may claim (Host.gpus)
    network: Optional[NetChoice] = None

    @property
    def job_dir(self) -> str:
        return f"{self.run_dir}/job"

    @property
    def exact_gpus(self) -> Optional[Tuple[int, ...]]:
        """The GPUs its ranks get, when the inventory names exactly one per rank (else chosen at launch)."""
        return self.gpus if isinstance(self.gpus, tuple) and len(self.gpus) == len(self.ranks) else None

    def gpu_text(self) -> str:
        """What the dry run says of this host's GPUs."""
        if self.gpus is None:
            return "-"
        if self.exact_gpus is not None:
            return ",".join(str(i) for i in self.exact_gpus)
        pool = "" if self.gpus == "auto" else " of " + ",".join(str(i) for i in self.gpus)
        return f"<{len(self.ranks)} free GPUs{pool}, chosen at launch>"


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
    launcher: str = "python"
    attempt: int = 0  # job.restarts: the attempt this plan is for (0-based)
    start_order: str = "all"  # job.start.order: all (every host at once) | rank (launch/start.py)
    start_gap_s: float = 0.0

    @property
    def ranks(self) -> Tuple[RankSpec, ...]:
        return tuple(r for n in self.nodes for r in n.ranks)

    @property
    def attempt_key(self) -> str:
        """How the host program names this attempt's folder: the run's own, or attempt-K inside it (every
        attempt runs in the same job folder)."""
        return attempt_key(self.run_id, self.attempt)


def new_run_id(now: Optional[float] = None) -> str:
    """Sorts by time: 20261130-142233-a1b2."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{random.SystemRandom().randrange(16 ** 4):04x}"


def attempt_key(run_id: str, attempt: int) -> str:
    """How the host program names an attempt's folder: RUN for the first, RUN/attempt-N for attempt N after a
    restart (attempt: the plan's index, 0 for the first; N counts from 1, as everything a user sees does)."""
    return run_id if attempt == 0 else f"{run_id}/attempt-{attempt + 1}"


def run_dir_for(host: Host, run_id: str) -> str:
    return f"{host.workdir.rstrip('/')}/runs/{run_id}"


def init_url(inv: Inventory, run_id: str, addr: str, port: str, attempt: int = 0) -> str:
    method = inv.job.init_method
    if method == "env":
        return "env://"
    if method == "tcp":
        host = f"[{addr}]" if ":" in addr else addr
        return f"tcp://{host}:{port}"
    suffix = f"-a{attempt}" if attempt else ""  # a file store is never reused: an old one holds old keys
    return f"file://{inv.job.shared_dir.rstrip('/')}/clusterrun-{run_id}{suffix}.init"


def chosen_interface(mode: str, found: Optional[Mapping]) -> Optional[str]:
    """The interface network.ifname gives a host's ranks (IFNAME_ENV): the one named, auto's find
    (found: remote/host/net/ifaces.find's answer, from the push or from check's probe), or None (none, or
    auto that found nothing: torch picks). The one derivation: launch (net_choice) and check
    (ranks_interface) both ask it."""
    if mode == "none":
        return None
    if mode != "auto":
        return mode
    return (found or {}).get("ifname") or None


def net_choice(host: Host, found: Optional[Mapping], master_addr: str) -> NetChoice:
    """What network.ifname means for this host, given what its push found toward rank 0's addr (found:
    remote/host/net/ifaces.find's answer; None before the push: --dry-run, the plan made before it)."""
    mode = host.ifname
    env = tuple(v for v in IFNAME_ENV if v not in host.env)
    mine = tuple(v for v in IFNAME_ENV if v in host.env)
    taken = f"; {', '.join(mine)} from env:" if mine else ""
    found = found or {}
    addrs = tuple((i.get("name", "?"), a) for i in found.get("interfaces") or () for a in i.get("addrs") or ())
    ifname = chosen_interface(mode, found)
    if ifname is None:
        return NetChoice(mode, None, _unset_why(host, found, master_addr) + taken, (), addrs)
    why = f"auto: {found.get('why', ifname)}" if mode == "auto" else f"{mode} ({host.ifname_key})"
    return NetChoice(mode, ifname, why + taken, env, addrs, mtu_of(found, ifname))


def _unset_why(host: Host, found: Mapping, master_addr: str) -> str:
    """Why network.ifname gives the ranks no interface: none, or auto before the push or without a find."""
    if host.ifname == "none":
        return f"none ({host.ifname_key}): torch picks (gloo: the address the host's name resolves to)"
    if not found:
        return f"auto: the interface that carries the route to {master_addr}, found while pushing"
    return f"auto: none found ({found.get('why', 'no answer')}): torch picks"


def ranks_interface(mode: str, env: Mapping[str, str], found: Optional[Mapping], backend: str,
                    routed: str) -> Tuple[str, Optional[int]]:
    """(interface, MTU) a host's ranks use toward rank 0's addr: the one its env: names in the backend's
    *_SOCKET_IFNAME (not NCCL's ^/= patterns), else what network.ifname gives them (chosen_interface), else
    routed (where the kernel sends: what torch picks then)."""
    value = env.get(ifname_var(backend)) or ""
    iface = value if value and not value.startswith(("^", "=")) else chosen_interface(mode, found) or routed
    return iface, mtu_of(found or {}, iface)


def ifname_var(backend: str) -> str:
    """The variable of IFNAME_ENV the backend reads."""
    return "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"


def mtu_of(found: Mapping, name: str) -> Optional[int]:
    """The MTU of this host's interface `name`, from ifaces.find's table (None: not known)."""
    return next((i.get("mtu") for i in found.get("interfaces") or () if i.get("name") == name), None)


def build_plan(inv: Inventory, run_id: str, *, master_port: Optional[int] = None, attempt: int = 0,
               hosts: Optional[Sequence[int]] = None, network: Optional[Mapping[int, Mapping]] = None) -> LaunchPlan:
    """Place ranks on hosts in node order (global rank = node order x slots) and fill in argv and env.

    hosts: the inventory indices taking part (a restart's survivors); every host when None. network: by
    inventory index, what each host's push found toward rank 0's addr (net_choice)."""
    if inv.job.entry is None:
        raise UsageError(f"{inv.path}: no job script; give one with --script PATH or job.script (or job.module)")
    for host in inv.hosts:
        taken = sorted(set(host.env) & set(CONTRACT_ENV))
        if taken:
            raise UsageError(f"{host.source}: env sets {', '.join(taken)}, which clusterrun sets for every rank")
    indices = list(range(len(inv.hosts))) if hosts is None else list(hosts)
    members = [inv.hosts[i] for i in indices]
    port = master_port if master_port is not None else inv.master_port
    port_text = str(port) if port is not None else AUTO_PORT
    world = sum(h.slots for h in members)
    master_addr = members[0].master_addr
    url = init_url(inv, run_id, master_addr, port_text, attempt)
    common = {"world_size": world, "nnodes": len(members), "master_addr": master_addr, "master_port": port_text,
              "dist_url": url, "run_id": run_id, "attempt": attempt + 1}
    nodes = []
    rank = 0
    for node_rank, (index, host) in enumerate(zip(indices, members)):
        values = {**common, "node_rank": node_rank, "nproc_per_node": host.slots}
        net = net_choice(host, (network or {}).get(index), master_addr)
        ranks = []
        for local_rank in range(host.slots):
            ranks.append(_rank(inv, host, dict(values, rank=rank, local_rank=local_rank), port_text, net))
            rank += 1
        node = NodePlan(node_rank=node_rank, host=host, run_dir=run_dir_for(host, run_id), ranks=tuple(ranks),
                        index=index, gpus=host.gpus, network=net)
        if inv.job.launcher == "torchrun":
            node = _torchrun_node(inv, node, values, port_text)
        nodes.append(node)
    return LaunchPlan(run_id=run_id, world_size=world, master_addr=master_addr, master_port=port,
                      init_url=url, backend=inv.job.backend, timeout_s=inv.job.timeout_s,
                      time_limit_s=inv.job.time_limit_s, nodes=tuple(nodes), secret_names=inv.secrets,
                      launcher=inv.job.launcher, attempt=attempt, start_order=inv.job.start_order,
                      start_gap_s=inv.job.start_gap_s)


def _contract_env(inv: Inventory, host: Host, values: Mapping[str, object], port_text: str) -> Dict[str, str]:
    """torchrun's contract (what its workers get), plus clusterrun's own variables, for one rank."""
    return {
        "RANK": str(values["rank"]), "WORLD_SIZE": str(values["world_size"]),
        "LOCAL_RANK": str(values["local_rank"]), "LOCAL_WORLD_SIZE": str(host.slots),
        "GROUP_RANK": str(values["node_rank"]), "GROUP_WORLD_SIZE": str(values["nnodes"]),
        "ROLE_RANK": str(values["rank"]), "ROLE_WORLD_SIZE": str(values["world_size"]),
        "NODE_RANK": str(values["node_rank"]), "MASTER_ADDR": str(values["master_addr"]), "MASTER_PORT": port_text,
        "CLUSTERRUN_RUN_ID": str(values["run_id"]), "CLUSTERRUN_NODE_NAME": host.name,
        "CLUSTERRUN_DIST_URL": str(values["dist_url"]), "CLUSTERRUN_DIST_BACKEND": inv.job.backend,
        "CLUSTERRUN_TIMEOUT": str(int(inv.job.timeout_s)), "CLUSTERRUN_ATTEMPT": str(values["attempt"]),
        "TORCHELASTIC_RESTART_COUNT": str(int(values["attempt"]) - 1),  # torch's: restarts so far
        "CLUSTERRUN_CHECKPOINT_DIR": inv.job.checkpoint_dir or f"{run_dir_for(host, str(values['run_id']))}/checkpoints",
    }


def _rank(inv: Inventory, host: Host, values: Mapping[str, object], port_text: str, net: NetChoice) -> RankSpec:
    job = inv.job
    env: Dict[str, str] = {**SOFT_DEFAULT_ENV, **{k: placeholders.render(v, values) for k, v in host.env.items()}}
    env.update({name: net.ifname for name in net.env if net.ifname})
    env.update(_contract_env(inv, host, values, port_text))
    env.update(flight_recorder_env(job.backend, run_dir_for(host, str(values["run_id"])), host.env))
    if isinstance(host.gpus, tuple) and len(host.gpus) == host.slots:  # named exactly: no choice at launch
        env[GPU_ENV] = ",".join(str(i) for i in host.gpus)
    flags = ("--rank", str(values["rank"]), "--world-size", str(values["world_size"])) if job.rank_flags else ()
    argv = (host.python, *job.entry, *flags, *(placeholders.render(a, values) for a in job.args))
    return RankSpec(rank=int(values["rank"]), local_rank=int(values["local_rank"]), node_rank=int(values["node_rank"]),
                    host_name=host.name, argv=argv, env=env)


def _torchrun_node(inv: Inventory, node: NodePlan, values: Mapping[str, object], port_text: str) -> NodePlan:
    """One `python -m torch.distributed.run` for the host: c10d rendezvous at rank 0's host and the master port,
    the run id as rendezvous id, this host's own address for its workers' peers to reach."""
    host, job = node.host, inv.job
    addr = str(values["master_addr"])
    endpoint = f"[{addr}]:{port_text}" if ":" in addr else f"{addr}:{port_text}"
    n = int(values["nnodes"])
    # torchrun restarts workers (job.restarts); hosts that are lost leave its rendezvous while job.min_nodes remain
    nnodes = f"{job.min_nodes}:{n}" if job.min_nodes and job.min_nodes < n else str(n)
    torchrun = (host.python, *TORCHRUN, "--nnodes", nnodes, "--node-rank", str(node.node_rank),
                "--nproc-per-node", str(host.slots), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                "--rdzv-id", str(values["run_id"]), "--max-restarts", str(job.restarts),
                "--local-addr", host.master_addr)
    entry = (*job.entry, *(placeholders.render(a, values) for a in job.args))
    env = {k: v for k, v in node.ranks[0].env.items() if k not in PER_WORKER_ENV} if node.ranks else {}
    # After a restart, workers that share the agents' rendezvous store can read the previous round's keys
    # (gloo then connects to addresses of workers that are gone): a fresh store per round avoids that.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update({k: placeholders.render(v, values) for k, v in host.env.items()})
    return NodePlan(node_rank=node.node_rank, host=host, run_dir=node.run_dir, ranks=node.ranks, torchrun=torchrun,
                    entry=entry, env=env, index=node.index, gpus=node.gpus, network=node.network)


def setup_request(inv: Inventory, plan: LaunchPlan, node: NodePlan, files: Mapping[str, object],
                  secrets: Mapping[str, str]) -> dict:
    """What the host's setup step gets (remote/host/push/job_setup.py): the commands, a key that changes when the
    commands, the pushed files they run beside (files: the push manifest's wire form) or the host's Python
    change, the deadline, and the environment (the host's env:, clusterrun's variables, the secrets)."""
    key = hashlib.sha256(json.dumps({"commands": list(inv.job.setup), "files": files, "python": node.host.python},
                                    sort_keys=True).encode()).hexdigest()
    first = node.ranks[0].env if node.ranks else {}
    env = {k: v for k, v in first.items() if k not in PER_WORKER_ENV}
    env.update({"CLUSTERRUN_NODE_RANK": str(node.node_rank), "CLUSTERRUN_PYTHON": node.host.python})
    env.update({name: secrets[name] for name in plan.secret_names})
    return {"commands": list(inv.job.setup), "key": key, "timeout": inv.timeouts.setup, "env": env,
            "secret_names": list(plan.secret_names)}


def known_addresses(plan: LaunchPlan) -> Dict[str, Tuple[str, str]]:
    """Every address the run knows of its hosts → (host, "addr" | "chosen" | the interface that holds it), for
    the root cause's hint (outcome.network_hint): the inventory's addr, the chosen interface's addresses,
    the others as the push reported them."""
    out: Dict[str, Tuple[str, str]] = {}
    for node in plan.nodes:
        chosen = node.network.ifname if node.network else None
        for iface, addr in node.network.addrs if node.network else ():
            out.setdefault(addr, (node.host.name, "chosen" if iface == chosen else iface))
        out[node.host.master_addr] = (node.host.name, "addr")
    return out


def node_command(node: NodePlan) -> Tuple[str, ...]:
    """The host's torchrun command line as a user would type it (clusterrun slips its worker shim in
    before the entry: see remote/host/run/worker.py)."""
    return node.torchrun + node.entry


def rank_env(plan: LaunchPlan, rank: RankSpec, secrets: Mapping[str, str]) -> Dict[str, str]:
    """The full env a rank gets: the plan's plus the secrets' values (these go only into a 0600 file)."""
    return {**rank.env, **{name: secrets[name] for name in plan.secret_names}}


def render_rank_command(plan: LaunchPlan, node: NodePlan, rank: RankSpec) -> str:
    """What a rank runs, as one shell line a user could paste on that host (secrets masked)."""
    env = [f"{k}={v}" for k, v in rank.env.items()] + [f"{k}={MASK}" for k in plan.secret_names]
    if node.gpus is not None and GPU_ENV not in rank.env:
        env.append(f"{GPU_ENV}={node.gpu_text()}")
    return f"cd {shell_path(node.job_dir)} && " + shlex.join(["env", *env, *rank.argv])


def render_node_command(plan: LaunchPlan, node: NodePlan) -> str:
    """Under torchrun: what the host runs, as one shell line (secrets masked)."""
    env = [f"{k}={v}" for k, v in node.env.items()] + [f"{k}={MASK}" for k in plan.secret_names]
    if node.gpus is not None and GPU_ENV not in node.env:
        env.append(f"{GPU_ENV}={node.gpu_text()}")
    return f"cd {shell_path(node.job_dir)} && " + shlex.join(["env", *env, *node_command(node)])


def shell_path(path: str) -> str:
    """Quote a path for a POSIX shell but leave a leading ~/ to be expanded there."""
    return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def plan_to_dict(plan: LaunchPlan) -> dict:
    """A JSON-able form of the plan for the run record and --json (it never holds secret values)."""
    return {
        "run_id": plan.run_id, "world_size": plan.world_size, "master_addr": plan.master_addr,
        "master_port": plan.master_port, "init_url": plan.init_url, "backend": plan.backend,
        "timeout_s": plan.timeout_s, "time_limit_s": plan.time_limit_s, "secret_names": list(plan.secret_names),
        "launcher": plan.launcher, "attempt": plan.attempt + 1,
        "start": {"order": plan.start_order, "gap_s": plan.start_gap_s},
        "nodes": [{"node_rank": n.node_rank, "index": n.index, "name": n.host.name, "host": n.host.host,
                   "connection": n.host.connection, "run_dir": n.run_dir,
                   "gpus": list(n.gpus) if isinstance(n.gpus, tuple) else n.gpus,
                   **({"network": n.network.to_json()} if n.network else {}),
                   **({"command": list(node_command(n)), "env": dict(n.env)} if n.torchrun else {}),
                   "ranks": [{"rank": r.rank, "local_rank": r.local_rank, "argv": list(r.argv),
                              "env": dict(r.env)} for r in n.ranks]} for n in plan.nodes],
    }


def interfaces_text(plan: LaunchPlan) -> str:
    """"GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME: eth1 on every host" (or per host), "" when none is set."""
    chosen = {n.host.name: n.network.ifname for n in plan.nodes if n.network and n.network.ifname and n.network.env}
    if not chosen:
        return ""
    names = "/".join(next(n.network.env for n in plan.nodes if n.host.name in chosen))
    values = set(chosen.values())
    if len(values) == 1 and len(chosen) == len(plan.nodes):
        return f"{names}={values.pop()} on every host"
    return f"{names}: " + ", ".join(f"{host} {ifname}" for host, ifname in chosen.items())


def rank_rows(plan: LaunchPlan) -> List[dict]:
    """The registry's rows for the plan's ranks."""
    return [{"rank": r.rank, "node_rank": r.node_rank, "host": r.host_name} for r in plan.ranks]
