"""Inventory (version 1): YAML or a DeepSpeed/OpenMPI hostfile → validated, frozen records.

Every problem names file:line:col and the key path (`hosts[1].port`). `parse_inventory` is pure (text
in, records out; a hostfile named by `hosts:` comes through the `read_text` it is given);
`load_inventory` adds reading the files. The job: section is config/job.py (with `check_job_files`, which
looks at the job's files on disk).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from ..errors import InventoryError, Problem, UsageError
from . import placeholders
from .hostfile import looks_like_hostfile, parse_hostfile
from .hosts import ENV_NAME_RE, HOST_KEYS, Host, make_host, read_host_settings, read_hosts, read_network
from .job import DEFAULT_EXCLUDES, JOB_KEYS, MODULE_RE, Job, check_files, default_job, entry_paths, read_job
from .job import with_rank_flags_decided as job_rank_flags
from .sizes import parse_size
from .yaml_nodes import STR as STR_TAG
from .yaml_nodes import NodeReader, compose

__all__ = ["DEFAULT_EXCLUDES", "JOB_KEYS", "Host", "Inventory", "Job", "Timeouts", "check_job_files", "entry_paths",
           "inventory_from_snapshot", "load_inventory", "parse_inventory", "with_overrides"]

TIMEOUT_KEYS = ("connect", "command", "host_lost", "grace", "setup", "notify")
TOP_KEYS = ("version", "defaults", "hosts", "master", "job", "secrets", "timeouts", "retention", "push", "network",
            "notify")
RETENTION_KEYS = ("keep_runs", "max_age", "cache_max", "every")
MASTER_PORT = 29500  # torch's own default (torchrun's --master-port)
RELAY = "auto"  # push.relay when not given
# where each key belongs, for one given in the wrong place (the first home wins: `port` is a host's)
KEY_HOMES: Dict[str, str] = {}
for _home, _keys in (("defaults", HOST_KEYS), ("job", JOB_KEYS), ("timeouts", TIMEOUT_KEYS),
                     ("retention", RETENTION_KEYS), ("", TOP_KEYS)):
    for _key in _keys:
        KEY_HOMES.setdefault(_key, f"{_home}.{_key}" if _home else _key)


@dataclass(frozen=True)
class Timeouts:
    connect: float = 10.0  # TCP connect, SSH banner, key exchange and auth, each
    command: float = 60.0  # any one remote command
    host_lost: float = 15.0  # no heartbeat from a host for this long: the host is lost
    grace: float = 10.0  # TERM → KILL
    setup: float = 600.0  # job.setup on one host, all its commands
    notify: float = 60.0  # each notify: command at the run's end (its process group is killed after this)


@dataclass(frozen=True)
class Retention:
    """What each host keeps after a launch (docs/operations.md); None: that rule is off."""

    keep_runs: Optional[int] = 20  # newest finished runs of this registry kept per host
    max_age_s: Optional[float] = 30 * 86400.0  # finished runs older than this go
    cache_max: Optional[int] = 20 * 10 ** 9  # the content cache is collected down to this many bytes
    enabled: bool = True  # `retention: off`: nothing is removed after a launch
    every_s: float = 3600.0  # at most one pass per inventory this often (0: after every launch)


@dataclass(frozen=True)
class Inventory:
    path: str
    hosts: Tuple[Host, ...]
    master_port: Optional[int]  # None = auto (MASTER_PORT when the inventory says nothing)
    job: Job
    secrets: Tuple[str, ...]
    timeouts: Timeouts = field(default_factory=Timeouts)
    master_port_fixed: bool = False  # the inventory names the port (kept on restarts; else one afresh)
    retention: Retention = field(default_factory=Retention)
    relay: str = RELAY  # push: {relay: auto|true|false}: hosts pass the push on to each other (hosts/relay.py)
    notify: Tuple[str, ...] = ()  # shell commands rank 0's host runs when the run ends (remote/host/run/notify.py)


def _no_files(path: str) -> str:
    raise OSError(2, "No such file or directory (no file access here)")


def parse_inventory(text: str, file: str, *, local_python: str = sys.executable,
                    read_text: Callable[[str], str] = _no_files) -> Inventory:
    """Validate inventory text (YAML v1, or a bare hostfile) into an Inventory. Pure: the only file it may
    see is a hostfile named by `hosts:`, through read_text."""
    base_dir = os.path.dirname(os.path.abspath(file))
    if looks_like_hostfile(text):
        return _hostfile_inventory(text, file, base_dir, local_python)

    r = NodeReader(file)
    r.homes = KEY_HOMES
    top = r.mapping(compose(text, file), "", TOP_KEYS, required=("version", "hosts"))
    _check_version(r, top)
    job = read_job(r, top["job"][1] if "job" in top else None, base_dir)
    r.context = job.launcher  # env: values may not use per-worker placeholders under torchrun
    defaults: dict = {}
    if "defaults" in top:
        defaults = read_host_settings(r, r.mapping(top["defaults"][1], "defaults", HOST_KEYS), "defaults")
    network = read_network(r, top["network"][1], "network") if "network" in top else None
    hosts = read_hosts(r, top["hosts"][1], defaults, base_dir, local_python, read_text, network,
                        job.backend) if "hosts" in top else []
    master_port = _read_master(r, top["master"][1]) if "master" in top else MASTER_PORT
    secrets = tuple(r.string_list(top["secrets"][1], "secrets", pattern=ENV_NAME_RE,
                                  what="environment variable name")) if "secrets" in top else ()
    timeouts = _read_timeouts(r, top["timeouts"][1]) if "timeouts" in top else Timeouts()
    retention = _read_retention(r, top["retention"][1]) if "retention" in top else Retention()
    relay = _read_push(r, top["push"][1]) if "push" in top else RELAY
    notify = tuple(r.string_list(top["notify"][1], "notify", nonempty=True)) if "notify" in top else ()
    _check_min_nodes(r, top, job, hosts)
    if r.problems:
        raise InventoryError(sorted(r.problems, key=lambda p: (p.line, p.column)))
    return _checked(Inventory(path=file, hosts=tuple(hosts), master_port=master_port, job=job,
                              secrets=secrets, timeouts=timeouts, master_port_fixed=_port_fixed(top, master_port),
                              retention=retention, relay=relay, notify=notify), file)


def _hostfile_inventory(text: str, file: str, base_dir: str, local_python: str) -> Inventory:
    """A bare hostfile: its hosts over SSH, the default job and master port."""
    defaults = {"connection": "ssh"}
    hosts = [make_host(s, defaults, local_python, src) for s, src in parse_hostfile(text, file)]
    job = default_job(base_dir)
    return _checked(Inventory(path=file, hosts=tuple(hosts), master_port=MASTER_PORT, job=job, secrets=()), file)


def _check_version(r: NodeReader, top: Dict[str, Tuple[yaml.Node, yaml.Node]]) -> None:
    if "version" in top:
        vnode = top["version"][1]
        if r.integer(vnode, "version", 1, 1_000_000) not in (None, 1):
            r.error(vnode, "version", f"this clusterrun reads inventory version 1, not {vnode.value}")


def _check_min_nodes(r: NodeReader, top: Dict[str, Tuple[yaml.Node, yaml.Node]], job: Job,
                     hosts: List[Host]) -> None:
    if job.min_nodes is not None and hosts and job.min_nodes > len(hosts):
        node = next(v for k, v in top["job"][1].value if k.value == "min_nodes")
        r.error(node, "job.min_nodes", f"is {job.min_nodes}, but the inventory has {len(hosts)} hosts")


def _port_fixed(top: Dict[str, Tuple[yaml.Node, yaml.Node]], master_port: Optional[int]) -> bool:
    """The inventory names master.port (not auto, not left out)."""
    return master_port is not None and "master" in top and \
        any(k.value == "port" for k, _ in getattr(top["master"][1], "value", ()) if hasattr(k, "value"))


def _read_master(r: NodeReader, node: yaml.Node) -> Optional[int]:
    """master.port: a number, or `auto` (None: a free port on rank 0's host)."""
    entries = r.mapping(node, "master", ("port",))
    if "port" not in entries:
        return MASTER_PORT
    pnode = entries["port"][1]
    if isinstance(pnode, yaml.ScalarNode) and pnode.tag == STR_TAG and pnode.value == "auto":
        return None
    return r.integer(pnode, "master.port", 1, 65535)


def _read_push(r: NodeReader, node: yaml.Node) -> str:
    """push: {relay: auto | true | false}."""
    entries = r.mapping(node, "push", ("relay",))
    if "relay" not in entries:
        return RELAY
    value = entries["relay"][1]
    if isinstance(value, yaml.ScalarNode) and value.value in ("auto", "true", "false"):
        return value.value  # also quoted: "true" reads as the user meant it
    flag = r.boolean(value, "push.relay")
    return RELAY if flag is None else ("true" if flag else "false")


def _read_retention(r: NodeReader, node: yaml.Node) -> Retention:
    """`retention: off`, or a mapping of keep_runs, max_age, cache_max (each `off` to drop that rule)."""
    if isinstance(node, yaml.ScalarNode) and node.value in ("off", "false", "no") or \
            isinstance(node, yaml.ScalarNode) and node.tag.endswith(":bool") and not yaml.safe_load(node.value):
        return Retention(enabled=False)
    entries = r.mapping(node, "retention", RETENTION_KEYS)
    values: dict = {}
    for key, (_, v) in entries.items():
        if isinstance(v, yaml.ScalarNode) and v.value in ("off", "none", "null", "~", "") and key != "every":
            values[{"max_age": "max_age_s"}.get(key, key)] = None
        else:
            values.update(_retention_value(r, key, v))
    return Retention(**values)


def _retention_value(r: NodeReader, key: str, v: yaml.Node) -> dict:
    """One rule of `retention:` that is not `off`, as Retention's field."""
    if key == "keep_runs":
        return {"keep_runs": r.integer(v, "retention.keep_runs", 0, 1_000_000)}
    if key == "max_age":
        return {"max_age_s": r.duration(v, "retention.max_age")}
    if key == "every":
        every = r.duration(v, "retention.every", zero=True)
        return {} if every is None else {"every_s": every}
    size = parse_size(v.value) if isinstance(v, yaml.ScalarNode) else None
    if size is None:
        r.error(v, "retention.cache_max", "expected a size such as 20G, 500M or 4096 (bytes), or off")
    return {"cache_max": size}


def _read_timeouts(r: NodeReader, node: yaml.Node) -> Timeouts:
    entries = r.mapping(node, "timeouts", TIMEOUT_KEYS)
    values = {k: r.duration(v, f"timeouts.{k}") for k, (_, v) in entries.items()}
    return Timeouts(**{k: v for k, v in values.items() if v is not None})


def _checked(inv: Inventory, file: str) -> Inventory:
    """Checks across entries: unique labels, no host listed twice, secrets not also in env, min_nodes."""
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
        if not os.path.lexists(full):  # said of the path as given, which is the current folder's, not job.root's
            raise UsageError(f"--script {script}: {full} does not exist (--script is relative to the current "
                             f"folder, {cwd or os.getcwd()})")
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


def check_job_files(inv: Inventory) -> None:
    """The job's entry point and sync paths exist under its root, and no symlink leads out of it."""
    check_files(inv.job, inv.path)


def with_rank_flags_decided(inv: Inventory) -> Inventory:
    """job.rank_flags, where the inventory leaves it open, decided from the script (config/job.py)."""
    return replace(inv, job=job_rank_flags(inv.job))


def inventory_snapshot(inv: Inventory) -> dict:
    """The inventory as recorded with a run: enough to reach the hosts again; secret names only."""
    return asdict(inv)


def inventory_from_snapshot(data: dict) -> Inventory:
    """The Inventory recorded with a run (inventory_snapshot), to reach its hosts again."""
    job = dict(data["job"])
    for key in ("args", "sync", "exclude", "setup", "outputs", "ports"):
        if key in job:
            job[key] = tuple(job[key])
    return Inventory(path=data["path"], hosts=tuple(Host(**dict(h, gpus=tuple(h["gpus"]) if isinstance(
        h.get("gpus"), list) else h.get("gpus"))) for h in data["hosts"]),
                     master_port=data["master_port"], job=Job(**job), secrets=tuple(data["secrets"]),
                     timeouts=Timeouts(**data["timeouts"]), master_port_fixed=data.get("master_port_fixed", False),
                     retention=Retention(**data.get("retention", {})), relay=data.get("relay", RELAY),
                     notify=tuple(data.get("notify") or ()))
