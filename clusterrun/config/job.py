"""The inventory's job: section → a frozen Job, every problem with file:line:col; and the check that the
job's files exist under its root (`check_files`, the one part that looks at the disk)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import yaml

from ..errors import UsageError
from . import placeholders
from .environment import Environment, read_environment
from .yaml_nodes import NodeReader, describe

JOB_KEYS = ("root", "script", "module", "args", "rank_flags", "launcher", "setup", "restarts", "min_nodes",
            "restart_delay", "checkpoint_dir", "sync", "exclude", "init_method", "backend", "timeout", "time_limit",
            "hang_timeout", "shared_dir", "outputs", "ports", "start", "environment")
START_KEYS = ("order", "gap")
START_ORDERS = ("all", "rank")
DEFAULT_GAP_S = 1.0  # order: rank without a gap: long enough for a script to take its rank from a counter
LAUNCHERS = ("python", "torchrun")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
DEFAULT_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".venv/", ".mypy_cache/", ".pytest_cache/")


@dataclass(frozen=True)
class Job:
    """The job: section; every default is here, once (a bare hostfile's job is `default_job`)."""

    root: str  # absolute folder that job paths are relative to and that is mirrored on the hosts
    script: Optional[str]  # relative POSIX path under root; None for a module job, or a bare hostfile
    args: Tuple[str, ...] = ()  # may hold placeholders ({rank}, {dist_url}, ...: config/placeholders.py)
    sync: Tuple[str, ...] = ()
    exclude: Tuple[str, ...] = DEFAULT_EXCLUDES
    init_method: str = "env"  # "env" | "tcp" | "file"
    backend: str = "gloo"  # "gloo" | "nccl"
    timeout_s: float = 1800.0
    time_limit_s: Optional[float] = None
    shared_dir: Optional[str] = None
    module: Optional[str] = None  # `python -m MODULE` (run in the pushed root) instead of a script
    rank_flags: bool = True  # `--rank i --world-size n` before the args (the tutorials' way)
    rank_flags_from: str = "inventory"  # "default": not given, may be decided from the script; "script": it was
    launcher: str = "python"  # python: one process per rank | torchrun: torch.distributed.run per host
    setup: Tuple[str, ...] = ()  # shell commands run on each host in the job folder before any rank starts
    restarts: int = 0  # attempts after the first, on the hosts still there (torchrun: its --max-restarts)
    min_nodes: Optional[int] = None  # fewer hosts left than this: no restart (None: every host)
    restart_delay_s: float = 5.0
    checkpoint_dir: Optional[str] = None  # shared across hosts and attempts; default: one per run and host
    outputs: Tuple[str, ...] = ()  # what `pull` brings back (paths or globs in the job folder, or checkpoints/...)
    ports: Tuple[int, ...] = ()  # ports on rank 0's host forwarded to this machine while an attached run lives
    hang_timeout_s: Optional[float] = None  # no rank wrote a line for this long: the run is hung (off: None)
    start_order: str = "all"  # all: every host at once | rank: host after host, rank after rank (launch/start.py)
    start_gap_s: float = 0.0  # order rank: the pause after each host's (and each rank's) start
    environment: Optional[Environment] = None  # a venv built once per host from a requirements file

    @property
    def entry(self) -> Optional[Tuple[str, ...]]:
        """What follows the interpreter: (script,) or ("-m", module); None when neither is set yet."""
        if self.module:
            return ("-m", self.module)
        return (self.script,) if self.script else None


def _rel_job_path(r: NodeReader, node: yaml.Node, key: str, value: str, root: str) -> Optional[str]:
    """A path under root, as a normalised relative POSIX path; None (with a problem) if it escapes."""
    full = os.path.normpath(os.path.join(root, value))
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        r.error(node, key, f"{value!r} is outside the job root {root} (set job.root to a folder that holds it)")
        return None
    rel = os.path.relpath(full, root).replace(os.sep, "/")
    return "." if rel == "." else rel


@dataclass(frozen=True)
class _Entries:
    """The job: mapping's entries by key, each read only where the inventory gives it."""

    by_name: Dict[str, Tuple[yaml.Node, yaml.Node]]
    prefix: str = "job"

    def node(self, name: str) -> Optional[yaml.Node]:
        return self.by_name[name][1] if name in self.by_name else None

    def read(self, name: str, read: Callable[..., Any], default: Any, **kwargs: Any) -> Any:
        """read(value node, "job.NAME", **kwargs) where the key is given; the default where it is not."""
        node = self.node(name)
        return default if node is None else read(node, f"{self.prefix}.{name}", **kwargs)


def default_job(root: str) -> Job:
    """The job of an inventory that has no job: section (a bare hostfile): every default, rank_flags open."""
    return Job(root=root, script=None, rank_flags_from="default")


_D = default_job("")  # the defaults, read where a key is not given or failed to read


def read_job(r: NodeReader, node: Optional[yaml.Node], base_dir: str) -> Job:
    job = _Entries(r.mapping(node, "job", JOB_KEYS) if node is not None else {})
    # In this order: a later check looks at the problems the reads before it reported (job.shared_dir's).
    root = _read_root(r, job, base_dir)
    script = _read_script(r, job, root)
    module = _read_module(r, job.node("module"), has_script=job.node("script") is not None)
    launcher = job.read("launcher", r.choice, _D.launcher, choices=LAUNCHERS) or _D.launcher
    rank_flags = _read_rank_flags(r, job, launcher)
    args = _read_args(r, job, launcher)
    init_method = _read_init_method(r, job, launcher)
    backend = job.read("backend", r.choice, _D.backend, choices=("gloo", "nccl"))
    timeout = job.read("timeout", r.duration, _D.timeout_s)
    time_limit = job.read("time_limit", r.duration, _D.time_limit_s)
    hang_timeout = job.read("hang_timeout", r.duration, _D.hang_timeout_s)
    shared_dir = _read_shared_dir(r, job.node("shared_dir"))
    _check_file_rendezvous(r, job, init_method, shared_dir)
    setup = tuple(job.read("setup", r.string_list, _D.setup, nonempty=True))
    restarts = job.read("restarts", r.integer, _D.restarts, lo=0, hi=1000)
    min_nodes = job.read("min_nodes", r.integer, _D.min_nodes, lo=1, hi=4096)
    delay = job.read("restart_delay", r.duration, _D.restart_delay_s, zero=True)
    checkpoint_dir = read_absolute(r, job.node("checkpoint_dir"), "job.checkpoint_dir",
                                    "must be an absolute path on the hosts (a shared folder, or one on each)")
    exclude = tuple(job.read("exclude", r.string_list, ()))
    outputs = _read_outputs(r, job.node("outputs"))
    ports = _read_ports(r, job.node("ports"))
    order, gap = _read_start(r, job.node("start"))
    environment = read_environment(r, job.node("environment"),
                                   lambda node, key, value: _rel_job_path(r, node, key, value, root))
    # A value that failed to read is None (its problem is recorded); the defaults keep the Job well-formed.
    return Job(root=root, script=script, args=args, sync=tuple(_read_sync(r, job.node("sync"), root)),
               exclude=_D.exclude + exclude, init_method=init_method or _D.init_method,
               backend=backend or _D.backend, timeout_s=timeout or _D.timeout_s, time_limit_s=time_limit,
               shared_dir=shared_dir, module=module, launcher=launcher,
               rank_flags=launcher == "python" if rank_flags is None else rank_flags,
               rank_flags_from="default" if rank_flags is None and launcher == "python" else "inventory",
               setup=setup, restarts=restarts or 0, min_nodes=min_nodes,
               restart_delay_s=_D.restart_delay_s if delay is None else delay, checkpoint_dir=checkpoint_dir,
               outputs=outputs, ports=ports, hang_timeout_s=hang_timeout,
               start_order=order, start_gap_s=gap, environment=environment)


def _read_start(r: NodeReader, node: Optional[yaml.Node]) -> Tuple[str, float]:
    """job.start: {order: rank, gap: 2s} (order all: every host at once, the default; a gap only with rank)."""
    if node is None:
        return _D.start_order, _D.start_gap_s
    start = _Entries(r.mapping(node, "job.start", START_KEYS), "job.start")
    order = start.read("order", r.choice, None, choices=START_ORDERS) or _D.start_order
    gap = start.read("gap", r.duration, None, zero=True)
    if gap is not None and order != "rank":
        r.error(start.node("gap"), "job.start.gap", "applies to order: rank only (order all starts every host "
                                                    "at once); add `order: rank`")
        return order, _D.start_gap_s
    if order != "rank":
        return order, _D.start_gap_s
    return order, DEFAULT_GAP_S if gap is None else gap


def _read_root(r: NodeReader, job: _Entries, base_dir: str) -> str:
    """job.root, relative to the inventory's folder; that folder itself when not given."""
    value = job.read("root", r.string, None)
    return base_dir if value is None else os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))


def _read_script(r: NodeReader, job: _Entries, root: str) -> Optional[str]:
    value = job.read("script", r.string, None)
    return None if value is None else _rel_job_path(r, job.node("script"), "job.script", value, root)


def _read_rank_flags(r: NodeReader, job: _Entries, launcher: str) -> Optional[bool]:
    """job.rank_flags as given (None: not given, the launcher decides)."""
    rank_flags = job.read("rank_flags", r.boolean, None)
    if rank_flags and launcher == "torchrun":
        r.error(job.node("rank_flags"), "job.rank_flags", "launcher: torchrun gives every worker its rank in RANK; "
                                                          "it cannot add --rank to each worker's arguments")
    return rank_flags


def _read_args(r: NodeReader, job: _Entries, launcher: str) -> Tuple[str, ...]:
    per_worker_ok = launcher != "torchrun"  # torchrun gives all of a host's workers one command line
    return tuple(job.read("args", r.string_list, (), numbers_ok=True,
                          check=lambda v: placeholders.check(v, per_worker_ok=per_worker_ok)))


def _read_init_method(r: NodeReader, job: _Entries, launcher: str) -> Optional[str]:
    init_method = job.read("init_method", r.choice, "env", choices=("env", "tcp", "file"))
    if launcher == "torchrun" and init_method not in (None, "env"):
        r.error(job.node("init_method"), "job.init_method", "launcher: torchrun makes the rendezvous itself and "
                                                            "hands each worker env://; leave init_method at env")
    return init_method


def _check_file_rendezvous(r: NodeReader, job: _Entries, init_method: Optional[str],
                           shared_dir: Optional[str]) -> None:
    """init_method: file needs a shared folder; said once, not again where job.shared_dir has its own problem."""
    if init_method == "file" and shared_dir is None and not any(p.key == "job.shared_dir" for p in r.problems):
        r.error(job.node("init_method"), "job.init_method",
                "init_method: file needs job.shared_dir, a folder every host sees at the same path")


def _read_module(r: NodeReader, node: Optional[yaml.Node], has_script: bool) -> Optional[str]:
    if node is None:
        return None
    value = r.string(node, "job.module", pattern=MODULE_RE, what="Python module name (pkg.train)")
    if value is not None and has_script:
        r.error(node, "job.module", "give job.script or job.module, not both")
        return None
    return value


def _read_sync(r: NodeReader, node: Optional[yaml.Node], root: str) -> List[str]:
    sync: List[str] = []
    if node is not None:
        for i, value in enumerate(r.string_list(node, "job.sync")):
            rel = _rel_job_path(r, node.value[i], f"job.sync[{i}]", value, root)
            if rel is not None:
                sync.append(rel + ("/" if value.endswith("/") and rel != "." else ""))
    return sync


def output_problem(value: str) -> Optional[str]:
    """What is wrong with a job.outputs entry or a `pull` PATH (None: nothing): it must stay in the run."""
    if ".." in value.split("/"):
        return f"{value!r} leads out of the run's folder (..); give a path inside the job folder"
    if value.startswith("/"):
        return (f"{value!r} is absolute; give a path relative to the job folder (where the ranks ran), or "
                "checkpoints/... for the run's checkpoint folder")
    if not value.strip("/. "):
        return f"{value!r} names nothing; give a file, a folder or a glob such as outputs/ or \"*.pt\""
    return None


def _read_outputs(r: NodeReader, node: Optional[yaml.Node]) -> Tuple[str, ...]:
    """job.outputs: paths or globs in the job folder (or checkpoints/...), each kept inside the run."""
    if node is None:
        return ()
    return tuple(r.string_list(node, "job.outputs", nonempty=True, check=output_problem))


def _read_ports(r: NodeReader, node: Optional[yaml.Node]) -> Tuple[int, ...]:
    """job.ports: TCP ports on rank 0's host (TensorBoard's 6006, Jupyter's 8888), each once."""
    if node is None:
        return ()
    if not isinstance(node, yaml.SequenceNode):
        r.error(node, "job.ports", f"expected a list of ports such as [6006], got {describe(node)}")
        return ()
    ports: List[int] = []
    for i, item in enumerate(node.value):
        port = r.integer(item, f"job.ports[{i}]", 1, 65535)
        if port is not None and port in ports:
            r.error(item, f"job.ports[{i}]", f"port {port} is listed twice")
        elif port is not None:
            ports.append(port)
    return tuple(ports)


def _read_shared_dir(r: NodeReader, node: Optional[yaml.Node]) -> Optional[str]:
    return read_absolute(r, node, "job.shared_dir", "must be an absolute path that every host shares")


def read_absolute(r: NodeReader, node: Optional[yaml.Node], key: str, why: str) -> Optional[str]:
    if node is None:
        return None
    value = r.string(node, key)
    if value is not None and not value.startswith("/"):
        r.error(node, key, why)
        return None
    return value


# A script that parses its options strictly errors out on --rank it does not declare: argparse's
# parse_args (parse_known_args lets unknown ones through), click.
_STRICT = re.compile(r"\.parse_args\s*\(|@click\.(?:command|option|argument)\b|\bclick\.command\s*\(")
_DECLARED = re.compile(r"""(['"])--(?:rank|world-size|world_size)\1""")
SOURCE_LIMIT = 1 << 20


def with_rank_flags_decided(job: Job) -> Job:
    """job.rank_flags where the inventory leaves it open: `--rank i --world-size n` are passed (the
    tutorials' way) unless the script parses its options strictly and declares neither, as a script
    written for torchrun does (it reads RANK and WORLD_SIZE from its environment): passing them would
    only fail it with "unrecognized arguments"."""
    if job.rank_flags_from != "default" or not job.rank_flags:
        return job
    source = _entry_source(job)
    if source is None or _DECLARED.search(source) or not _STRICT.search(source):
        return job
    return replace(job, rank_flags=False, rank_flags_from="script")


# The DDP tutorial's setup(): os.environ['MASTER_ADDR'] = 'localhost' (and a port), or an init_method that
# names this machine: each overrides what clusterrun gives every rank.
_SETS_MASTER = re.compile(r"""os\.environ\[\s*(['"])(MASTER_ADDR|MASTER_PORT)\1\s*\]\s*=(?!=)\s*([^#\n]*)""")
_LOCAL_URL = re.compile(r"""['"]tcp://(localhost|127\.0\.0\.1|0\.0\.0\.0)[:'"]""")


def rendezvous_overrides(job: Job, hosts: int) -> List[str]:
    """Lines of the entry script that set the rendezvous themselves, each as a warning with file:line and
    the fix (hosts: how many hosts the run has; on one, only a fixed port is worth a word)."""
    source = _entry_source(job)
    if source is None:
        return []
    name = job.script or job.module
    out = []
    for number, line in enumerate(source.splitlines(), 1):
        found = _SETS_MASTER.search(line)
        if found and found.group(2) == "MASTER_ADDR" and hosts > 1:
            out.append(f"{name}:{number} sets MASTER_ADDR = {found.group(3).strip()} itself (as the DDP tutorial's "
                       "setup() does): every rank would look for rank 0 on its own host and wait out torch's "
                       "timeout; clusterrun gives every rank MASTER_ADDR and MASTER_PORT: remove the line, or "
                       "use os.environ.setdefault(...)")
        elif found and found.group(2) == "MASTER_PORT":
            out.append(f"{name}:{number} sets MASTER_PORT = {found.group(3).strip()} itself: the ranks use that "
                       "port, not the one clusterrun chose (master.port), so a port in use there is not caught "
                       "before the start; remove the line, or use os.environ.setdefault(...)")
        elif hosts > 1 and _LOCAL_URL.search(line):
            out.append(f"{name}:{number} names this machine in a tcp:// init_method ({_LOCAL_URL.search(line).group(1)}): "
                       "on other hosts that is not rank 0's; use init_method=\"env://\" (clusterrun sets "
                       "MASTER_ADDR/MASTER_PORT) or the {dist_url} placeholder in job.args")
    return out


def _entry_source(job: Job) -> Optional[str]:
    """The text of the script (or the module's file) the ranks run; None when it cannot be read."""
    if job.module:
        base = os.path.join(job.root, *job.module.split("."))
        paths = [base + ".py", os.path.join(base, "__main__.py")]
    else:
        paths = [os.path.join(job.root, job.script)] if job.script else []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                return fh.read(SOURCE_LIMIT).decode("utf-8", "replace")
        except OSError:
            continue
    return None


def entry_paths(job: Job) -> List[str]:
    """What the job's entry point needs pushed, relative to the root: the script, or the module's top-level
    package folder (or single file)."""
    if job.module:
        top = job.module.split(".")[0]
        return [top if os.path.isdir(os.path.join(job.root, top)) else f"{top}.py"]
    return [job.script] if job.script else []


def _module_problem(job: Job) -> Optional[str]:
    parts = job.module.split(".")
    base = os.path.join(job.root, *parts)
    if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__main__.py")):
        return None
    return (f"job.module {job.module}: neither {base}.py nor {base}/__main__.py exists under the job root "
            f"{job.root} (python -m runs in the pushed copy of the root)")


def _missing(key: str, rel: str, root: str, where: str) -> str:
    """A job path that does not exist, said with the root it was looked for under, and where it is if it
    is beside the inventory or here (an inventory copied from elsewhere keeps its absolute job.root)."""
    text = f"{key}: {os.path.join(root, rel)} does not exist (job paths are relative to job.root, {root})"
    inventory_dir = os.path.dirname(os.path.abspath(where))
    for base, fix in ((inventory_dir, "leave job.root out (it defaults to the inventory's folder) or set "
                                      "job.root: ."), (os.getcwd(), f"set job.root: {os.getcwd()}")):
        if os.path.realpath(base) != os.path.realpath(root) and os.path.lexists(os.path.join(base, rel)):
            return text + f"; it is in {base}: {fix}"
    return text


def _named_paths(job: Job) -> List[Tuple[str, str]]:
    """(key, path under root) of every file or folder the job names."""
    named = [("job.script", job.script)] if job.script else [("job.module", p) for p in entry_paths(job)]
    env = [("job.environment.requirements", job.environment.requirements)] if job.environment else []
    return named + env + [(f"job.sync[{i}]", s) for i, s in enumerate(job.sync)]


def check_files(job: Job, where: str) -> None:
    """The entry point and every sync path exist under the root, and no symlink leads out of it (where: the
    inventory's path, for the message)."""
    problems = []
    if job.entry is None:
        raise UsageError(f"{where}: no job script; give one with --script PATH or job.script (or job.module)")
    root = os.path.realpath(job.root)
    if job.module and _module_problem(job):
        problems.append(_module_problem(job))
    for key, rel in _named_paths(job):
        full = os.path.join(job.root, rel)
        if not os.path.lexists(full):
            if key != "job.module":  # the module's own problem says it better
                problems.append(_missing(key, rel, job.root, where))
            continue
        real = os.path.realpath(full)
        if real != root and not real.startswith(root + os.sep):
            problems.append(f"{key}: {full} resolves to {real}, outside the job root {root} (symlink out of it)")
        elif key == "job.script" and not os.path.isfile(real):
            problems.append(f"{key}: {full} is not a file")
    if problems:
        raise UsageError(f"{where}: " + "\n  ".join(["job files are missing or unsafe:"] + problems))
