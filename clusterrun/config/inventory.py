"""Inventory (version 1): YAML or a DeepSpeed/OpenMPI hostfile → validated, frozen records.

Every problem names file:line:col and the key path (`hosts[1].port`). `parse_inventory` is pure (text
in, records out; a hostfile named by `hosts:` comes through the `read_text` it is given);
`load_inventory` adds reading the files, and `check_job_files` looks at the job's files on disk.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from ..errors import InventoryError, Problem, UsageError
from . import placeholders
from .hostfile import HOSTNAME_RE, looks_like_hostfile, parse_hostfile
from .yaml_nodes import STR as STR_TAG
from .yaml_nodes import NodeReader, compose

HOST_KEYS = ("user", "port", "identity_file", "known_hosts", "host_key_policy", "python", "workdir",
             "connection", "env", "proxy_jump", "slots")
HOST_ONLY_KEYS = ("name", "host", "addr")
JOB_KEYS = ("root", "script", "module", "args", "rank_flags", "launcher", "setup", "restarts", "sync", "exclude",
            "init_method", "backend", "timeout", "time_limit", "shared_dir")
TIMEOUT_KEYS = ("connect", "command", "host_lost", "grace", "setup")
LAUNCHERS = ("python", "torchrun")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
TOP_KEYS = ("version", "defaults", "hosts", "master", "job", "secrets", "timeouts")

# What may reach an SSH command line or a file name is held to plain characters; everything else (env
# values, script args) is passed byte-exact through JSON and never seen by a shell.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JUMP_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9_\[][A-Za-z0-9._:%\[\]-]*(?::\d+)?"
                     r"(?:,(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9_\[][A-Za-z0-9._:%\[\]-]*(?::\d+)?)*$")

DEFAULT_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".venv/", ".mypy_cache/", ".pytest_cache/")


@dataclass(frozen=True)
class Host:
    """One machine of the inventory. None means: let ~/.ssh/config or SSH's defaults decide."""

    name: str
    host: str
    addr: Optional[str]
    slots: int
    connection: str  # "ssh" | "local"
    user: Optional[str]
    port: Optional[int]
    identity_file: Optional[str]
    known_hosts: Optional[str]
    host_key_policy: str  # "strict" | "accept-new"
    python: str
    workdir: str
    env: Mapping[str, str]
    proxy_jump: Optional[str]
    source: str  # file:line:col of the entry, for messages found later

    @property
    def master_addr(self) -> str:
        return self.addr or self.host


@dataclass(frozen=True)
class Job:
    root: str  # absolute folder that job paths are relative to and that is mirrored on the hosts
    script: Optional[str]  # relative POSIX path under root; None for a module job, or a bare hostfile
    args: Tuple[str, ...]  # may hold placeholders ({rank}, {dist_url}, ...: config/placeholders.py)
    sync: Tuple[str, ...]
    exclude: Tuple[str, ...]
    init_method: str  # "env" | "tcp" | "file"
    backend: str  # "gloo" | "nccl"
    timeout_s: float
    time_limit_s: Optional[float]
    shared_dir: Optional[str]
    module: Optional[str] = None  # `python -m MODULE` (run in the pushed root) instead of a script
    rank_flags: bool = True  # `--rank i --world-size n` before the args (the tutorials' way)
    launcher: str = "python"  # python: one process per rank | torchrun: torch.distributed.run per host
    setup: Tuple[str, ...] = ()  # shell commands run on each host in the job folder before any rank starts
    restarts: int = 0

    @property
    def entry(self) -> Optional[Tuple[str, ...]]:
        """What follows the interpreter: (script,) or ("-m", module); None when neither is set yet."""
        if self.module:
            return ("-m", self.module)
        return (self.script,) if self.script else None

    @property
    def entry_text(self) -> str:
        return f"-m {self.module}" if self.module else (self.script or "")


@dataclass(frozen=True)
class Timeouts:
    connect: float = 10.0  # TCP connect, SSH banner, key exchange and auth, each
    command: float = 60.0  # any one remote command
    host_lost: float = 15.0  # no heartbeat from a host for this long: the host is lost
    grace: float = 10.0  # TERM → KILL
    setup: float = 600.0  # job.setup on one host, all its commands


@dataclass(frozen=True)
class Inventory:
    path: str
    hosts: Tuple[Host, ...]
    master_port: Optional[int]  # None = auto
    job: Job
    secrets: Tuple[str, ...]
    timeouts: Timeouts = field(default_factory=Timeouts)


def _rel_job_path(r: NodeReader, node: yaml.Node, key: str, value: str, root: str) -> Optional[str]:
    """A path under root, as a normalised relative POSIX path; None (with a problem) if it escapes."""
    full = os.path.normpath(os.path.join(root, value))
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        r.error(node, key, f"{value!r} is outside the job root {root} (set job.root to a folder that holds it)")
        return None
    rel = os.path.relpath(full, root).replace(os.sep, "/")
    return "." if rel == "." else rel


def _read_job(r: NodeReader, node: Optional[yaml.Node], base_dir: str) -> Job:
    entries = r.mapping(node, "job", JOB_KEYS) if node is not None else {}

    def get(name):
        return entries[name][1] if name in entries else None

    root = base_dir
    if get("root") is not None:
        value = r.string(get("root"), "job.root")
        if value is not None:
            root = os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))
    script = None
    if get("script") is not None:
        value = r.string(get("script"), "job.script")
        if value is not None:
            script = _rel_job_path(r, get("script"), "job.script", value, root)
    module = _read_module(r, get("module"), has_script=get("script") is not None)
    launcher = r.choice(get("launcher"), "job.launcher", LAUNCHERS) if get("launcher") is not None else "python"
    launcher = launcher or "python"
    rank_flags = r.boolean(get("rank_flags"), "job.rank_flags") if get("rank_flags") is not None else None
    if rank_flags and launcher == "torchrun":
        r.error(get("rank_flags"), "job.rank_flags", "launcher: torchrun gives every worker its rank in RANK; "
                                                      "it cannot add --rank to each worker's arguments")
    args = tuple(r.string_list(get("args"), "job.args", numbers_ok=True,
                               check=lambda v: placeholders.check(v, per_worker_ok=launcher != "torchrun"))) \
        if get("args") is not None else ()
    init_method = r.choice(get("init_method"), "job.init_method", ("env", "tcp", "file")) \
        if get("init_method") is not None else "env"
    if launcher == "torchrun" and init_method not in (None, "env"):
        r.error(get("init_method"), "job.init_method", "launcher: torchrun makes the rendezvous itself and hands "
                                                        "each worker env://; leave init_method at env")
    backend = r.choice(get("backend"), "job.backend", ("gloo", "nccl")) if get("backend") is not None else "gloo"
    timeout = r.duration(get("timeout"), "job.timeout") if get("timeout") is not None else 1800.0
    time_limit = r.duration(get("time_limit"), "job.time_limit") if get("time_limit") is not None else None
    shared_dir = _read_shared_dir(r, get("shared_dir"))
    if init_method == "file" and shared_dir is None and not any(p.key == "job.shared_dir" for p in r.problems):
        r.error(get("init_method"), "job.init_method",
                "init_method: file needs job.shared_dir, a folder every host sees at the same path")
    setup = tuple(r.string_list(get("setup"), "job.setup", nonempty=True)) if get("setup") is not None else ()
    restarts = r.integer(get("restarts"), "job.restarts", 0, 1000) if get("restarts") is not None else 0
    exclude = tuple(r.string_list(get("exclude"), "job.exclude")) if get("exclude") is not None else ()
    return Job(root=root, script=script, args=args, sync=tuple(_read_sync(r, get("sync"), root)),
               exclude=DEFAULT_EXCLUDES + exclude, init_method=init_method or "env", backend=backend or "gloo",
               timeout_s=timeout or 1800.0, time_limit_s=time_limit, shared_dir=shared_dir, module=module,
               rank_flags=launcher == "python" if rank_flags is None else rank_flags, launcher=launcher,
               setup=setup, restarts=restarts or 0)


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


def _read_shared_dir(r: NodeReader, node: Optional[yaml.Node]) -> Optional[str]:
    if node is None:
        return None
    shared_dir = r.string(node, "job.shared_dir")
    if shared_dir is not None and not shared_dir.startswith("/"):
        r.error(node, "job.shared_dir", "must be an absolute path that every host shares")
        return None
    return shared_dir


def _read_host_settings(r: NodeReader, entries: Dict[str, Tuple[yaml.Node, yaml.Node]], key: str) -> dict:
    """The keys that defaults and hosts share, as a dict of only the keys given."""
    out: dict = {}
    for name, (_, vnode) in entries.items():
        path = f"{key}.{name}"
        if name == "port":
            out[name] = r.integer(vnode, path, 1, 65535)
        elif name == "slots":
            out[name] = r.integer(vnode, path, 1, 4096)
        elif name == "user":
            out[name] = r.string(vnode, path, pattern=USER_RE, what="user name")
        elif name == "host_key_policy":
            out[name] = r.choice(vnode, path, ("strict", "accept-new"))
        elif name == "connection":
            out[name] = r.choice(vnode, path, ("ssh", "local"))
        elif name == "env":
            out[name] = r.string_map(vnode, path, key_pattern=ENV_NAME_RE, key_what="environment variable name",
                                     check=lambda v: placeholders.check(v, per_worker_ok=r.context != "torchrun"))
        elif name == "proxy_jump":
            out[name] = r.string(vnode, path, pattern=JUMP_RE, what="ProxyJump spec ([user@]host[:port][,...])")
        elif name in HOST_KEYS:
            out[name] = r.string(vnode, path)
    return {k: v for k, v in out.items() if v is not None}


def _make_host(settings: dict, defaults: dict, local_python: str, source: str) -> Host:
    merged = {**defaults, **settings}
    merged["env"] = {**defaults.get("env", {}), **settings.get("env", {})}
    connection = merged.get("connection", "ssh")
    host = merged.get("host") or ("localhost" if connection == "local" else "")
    addr = merged.get("addr") or ("127.0.0.1" if connection == "local" else None)
    return Host(
        name=merged.get("name") or host, host=host, addr=addr, slots=merged.get("slots", 1),
        connection=connection, user=merged.get("user"), port=merged.get("port"),
        identity_file=merged.get("identity_file"), known_hosts=merged.get("known_hosts"),
        host_key_policy=merged.get("host_key_policy", "strict"),
        python=merged.get("python") or ("python3" if connection == "ssh" else local_python),
        workdir=merged.get("workdir", "~/.clusterrun"), env=merged["env"], proxy_jump=merged.get("proxy_jump"),
        source=source)


def _no_files(path: str) -> str:
    raise OSError(2, "No such file or directory (no file access here)")


def parse_inventory(text: str, file: str, *, local_python: str = sys.executable,
                    read_text: Callable[[str], str] = _no_files) -> Inventory:
    """Validate inventory text (YAML v1, or a bare hostfile) into an Inventory. Pure: the only file it may
    see is a hostfile named by `hosts:`, through read_text."""
    base_dir = os.path.dirname(os.path.abspath(file))
    if looks_like_hostfile(text):
        defaults = {"connection": "ssh"}
        hosts = [_make_host(s, defaults, local_python, src) for s, src in parse_hostfile(text, file)]
        job = Job(root=base_dir, script=None, args=(), sync=(), exclude=DEFAULT_EXCLUDES, init_method="env",
                  backend="gloo", timeout_s=1800.0, time_limit_s=None, shared_dir=None)
        return _checked(Inventory(path=file, hosts=tuple(hosts), master_port=29500, job=job, secrets=()), file)

    r = NodeReader(file)
    top = r.mapping(compose(text, file), "", TOP_KEYS, required=("version", "hosts"))
    if "version" in top:
        vnode = top["version"][1]
        if r.integer(vnode, "version", 1, 1_000_000) not in (None, 1):
            r.error(vnode, "version", f"this clusterrun reads inventory version 1, not {vnode.value}")
    job = _read_job(r, top["job"][1] if "job" in top else None, base_dir)
    r.context = job.launcher  # env: values may not use per-worker placeholders under torchrun
    defaults: dict = {}
    if "defaults" in top:
        defaults = _read_host_settings(r, r.mapping(top["defaults"][1], "defaults", HOST_KEYS), "defaults")
    hosts = _read_hosts(r, top["hosts"][1], defaults, base_dir, local_python, read_text) if "hosts" in top else []
    master_port = _read_master(r, top["master"][1]) if "master" in top else 29500
    secrets = tuple(r.string_list(top["secrets"][1], "secrets", pattern=ENV_NAME_RE,
                                  what="environment variable name")) if "secrets" in top else ()
    timeouts = _read_timeouts(r, top["timeouts"][1]) if "timeouts" in top else Timeouts()
    if r.problems:
        raise InventoryError(sorted(r.problems, key=lambda p: (p.line, p.column)))
    return _checked(Inventory(path=file, hosts=tuple(hosts), master_port=master_port, job=job,
                              secrets=secrets, timeouts=timeouts), file)


def _read_hosts(r: NodeReader, hnode: yaml.Node, defaults: dict, base_dir: str, local_python: str,
                read_text: Callable[[str], str]) -> List[Host]:
    if isinstance(hnode, yaml.ScalarNode) and hnode.tag == STR_TAG:
        path = os.path.join(base_dir, os.path.expanduser(hnode.value))
        try:
            listed = parse_hostfile(read_text(path), path)
        except OSError as exc:
            r.error(hnode, "hosts", f"cannot read hostfile {path}: {exc.strerror}")
            listed = []
        return [_make_host(s, defaults, local_python, src) for s, src in listed]
    if not isinstance(hnode, yaml.SequenceNode) or not hnode.value:
        r.error(hnode, "hosts", "expected a non-empty list of hosts (or the path of a hostfile)")
        return []
    hosts = []
    for i, item in enumerate(hnode.value):
        key = f"hosts[{i}]"
        entries = r.mapping(item, key, HOST_KEYS + HOST_ONLY_KEYS)
        settings = _read_host_settings(r, entries, key)
        for name, pattern, what in (("name", NAME_RE, "host label (letters, digits, . _ -)"),
                                    ("host", HOSTNAME_RE, "host name, address or ssh alias"),
                                    ("addr", HOSTNAME_RE, "address")):
            if name in entries:
                value = r.string(entries[name][1], f"{key}.{name}", pattern=pattern, what=what)
                if value is not None:
                    settings[name] = value
        if "host" not in entries and {**defaults, **settings}.get("connection", "ssh") == "ssh":
            r.error(item, key, "missing required key 'host'")
        src = f"{r.file}:{item.start_mark.line + 1}:{item.start_mark.column + 1}"
        hosts.append(_make_host(settings, defaults, local_python, src))
    return hosts


def _read_master(r: NodeReader, node: yaml.Node) -> Optional[int]:
    """master.port: a number, or `auto` (None: a free port on rank 0's host)."""
    entries = r.mapping(node, "master", ("port",))
    if "port" not in entries:
        return 29500
    pnode = entries["port"][1]
    if isinstance(pnode, yaml.ScalarNode) and pnode.tag == STR_TAG and pnode.value == "auto":
        return None
    return r.integer(pnode, "master.port", 1, 65535)


def _read_timeouts(r: NodeReader, node: yaml.Node) -> Timeouts:
    entries = r.mapping(node, "timeouts", TIMEOUT_KEYS)
    values = {k: r.duration(v, f"timeouts.{k}") for k, (_, v) in entries.items()}
    return Timeouts(**{k: v for k, v in values.items() if v is not None})


def _checked(inv: Inventory, file: str) -> Inventory:
    """Checks across entries: unique labels, no host listed twice, secrets not also in env."""
    problems: List[Problem] = []

    def at(index: int, message: str) -> None:
        _, line, col = inv.hosts[index].source.rsplit(":", 2)
        problems.append(Problem(file, int(line), int(col), f"hosts[{index}]", message))

    seen_names: Dict[str, Host] = {}
    seen_targets: Dict[tuple, Host] = {}
    for i, h in enumerate(inv.hosts):
        if h.name in seen_names:
            at(i, f"duplicate host name {h.name!r} (also at {seen_names[h.name].source}); names label logs")
        seen_names.setdefault(h.name, h)
        target = (h.connection, h.user, h.host, h.port, h.workdir)
        if target in seen_targets:
            at(i, f"{h.host!r} is listed twice with the same workdir (also at {seen_targets[target].source}); "
                  "use slots: N for several processes on one host")
        seen_targets.setdefault(target, h)
        for name in inv.secrets:
            if name in h.env:
                at(i, f"{name} is both a secret and an env value; secrets come only from the controller's "
                      "environment")
    if problems:
        raise InventoryError(problems)
    return inv


def load_inventory(path: str, *, local_python: str = sys.executable) -> Inventory:
    """Read and validate an inventory file, including the job's files on this machine."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read inventory {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError([Problem(path, 1, 1, "", f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_inventory(text, path, local_python=local_python, read_text=_read_text)


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def with_overrides(inv: Inventory, *, script: Optional[str] = None, args: Optional[Sequence[str]] = None,
                   cwd: Optional[str] = None, module: Optional[str] = None) -> Inventory:
    """Apply `--script PATH` (relative to cwd) or `--module NAME`, and `-- ARGS` from the command line."""
    job = inv.job
    if script is not None and module is not None:
        raise UsageError("give --script or --module, not both")
    if script is not None:
        full = os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(script)))
        root = job.root
        if not (full == root or full.startswith(root.rstrip(os.sep) + os.sep)):
            raise UsageError(f"--script {script}: {full} is outside the job root {root}; "
                             "set job.root in the inventory to a folder that holds it")
        job = replace(job, script=os.path.relpath(full, root).replace(os.sep, "/"), module=None)
    if module is not None:
        if not MODULE_RE.match(module):
            raise UsageError(f"--module {module!r} is not a Python module name (pkg.train)")
        job = replace(job, module=module, script=None)
    if args is not None:
        for arg in args:
            problem = placeholders.check(arg, per_worker_ok=job.launcher != "torchrun")
            if problem:
                raise UsageError(f"argument {arg!r} after --: {problem}")
        job = replace(job, args=tuple(args))
    return replace(inv, job=job)


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


def check_job_files(inv: Inventory) -> None:
    """The entry point and every sync path exist under the root, and no symlink leads out of it."""
    job = inv.job
    problems = []
    if job.entry is None:
        raise UsageError(f"{inv.path}: no job script; give one with --script PATH or job.script (or job.module)")
    root = os.path.realpath(job.root)
    if job.module and _module_problem(job):
        problems.append(_module_problem(job))
    named = [("job.script", job.script)] if job.script else [("job.module", p) for p in entry_paths(job)]
    for key, rel in named + [(f"job.sync[{i}]", s) for i, s in enumerate(job.sync)]:
        full = os.path.join(job.root, rel)
        if not os.path.lexists(full):
            if key != "job.module":  # the module's own problem says it better
                problems.append(f"{key}: {full} does not exist")
            continue
        real = os.path.realpath(full)
        if real != root and not real.startswith(root + os.sep):
            problems.append(f"{key}: {full} resolves to {real}, outside the job root {root} (symlink out of it)")
        elif key == "job.script" and not os.path.isfile(real):
            problems.append(f"{key}: {full} is not a file")
    if problems:
        raise UsageError(f"{inv.path}: " + "\n  ".join(["job files are missing or unsafe:"] + problems))


def inventory_from_snapshot(data: dict) -> Inventory:
    """The Inventory recorded with a run (see runner.inventory_snapshot), to reach its hosts again."""
    job = dict(data["job"])
    for key in ("args", "sync", "exclude", "setup"):
        if key in job:
            job[key] = tuple(job[key])
    return Inventory(path=data["path"], hosts=tuple(Host(**h) for h in data["hosts"]),
                     master_port=data["master_port"], job=Job(**job), secrets=tuple(data["secrets"]),
                     timeouts=Timeouts(**data["timeouts"]))
