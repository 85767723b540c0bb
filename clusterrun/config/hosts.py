"""The inventory's hosts: `defaults:` and `hosts:` (a list, or a hostfile's path) → frozen Host records,
every problem with file:line:col and key path (`hosts[1].port`). Pure, like the rest of config/: a
hostfile named by `hosts:` comes through the read_text the caller gives."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import yaml

from . import placeholders
from .hostfile import HOSTNAME_RE, parse_hostfile
from .yaml_nodes import STR as STR_TAG
from .yaml_nodes import NodeReader

HOST_KEYS = ("user", "port", "identity_file", "known_hosts", "host_key_policy", "python", "workdir",
             "connection", "env", "proxy_jump", "slots", "gpus", "claims", "gpu_check", "gpu_devices")
HOST_ONLY_KEYS = ("name", "host", "addr", "network")
CLAIMS_KEYS = ("dir", "slots")
CLAIMS_DIR = "/tmp/clusterrun-claims"  # the host program's share/claims.DEFAULT_DIR
GPU_MAX = 1023
# What may reach an SSH command line or a file name is held to plain characters; everything else (env
# values, script args) is passed byte-exact through JSON and never seen by a shell.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}$")  # Linux: at most 15 characters
IFNAME_MODES = ("auto", "none")  # network.ifname: found at launch / torch's own choice; else an interface name
JUMP_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9_\[][A-Za-z0-9._:%\[\]-]*(?::\d+)?"
                     r"(?:,(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9_\[][A-Za-z0-9._:%\[\]-]*(?::\d+)?)*$")


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
    # the GPUs a run may claim here: None (none), "auto" (every GPU the host reports) or indices
    gpus: Union[None, str, Tuple[int, ...]] = None
    claims_dir: Optional[str] = None  # where runs claim this host's slots and GPUs (None: claims off)
    claim_slots: Optional[int] = None  # slots the host offers all users together (None: its CPUs)
    ifname: str = "auto"  # network.ifname: auto (found at launch), none (torch's default) or an interface name
    ifname_key: str = ""  # where the inventory set it (hosts[1].network.ifname, network.ifname; "": the default)
    gpu_check: bool = True  # the GPU preflight (docs/gpus.md) on this host's GPUs, in check and launch
    gpu_devices: str = "/dev/nvidia*"  # the device files whose holders are leftovers (a glob; docs/gpus.md)

    @property
    def master_addr(self) -> str:
        return self.addr or self.host


def read_host_settings(r: NodeReader, entries: Dict[str, Tuple[yaml.Node, yaml.Node]], key: str) -> dict:
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
        elif name == "gpus":
            out[name] = _read_gpus(r, vnode, path)
        elif name == "claims":
            out[name] = _read_claims(r, vnode, path)
        elif name == "gpu_check":
            out[name] = r.boolean(vnode, path)
        elif name in HOST_KEYS:
            out[name] = r.string(vnode, path)
    return {k: v for k, v in out.items() if v is not None}


def _read_gpus(r: NodeReader, node: yaml.Node, path: str) -> object:
    """gpus: auto | none | [indices] (also "0,1"): "auto", "none" or a tuple of indices."""
    if isinstance(node, yaml.ScalarNode) and node.tag == STR_TAG and node.value in ("auto", "none"):
        return node.value
    if isinstance(node, yaml.ScalarNode) and node.tag == STR_TAG and re.fullmatch(r"\d+(,\d+)*", node.value):
        values = [int(v) for v in node.value.split(",")]
    elif isinstance(node, yaml.SequenceNode):
        values = [r.integer(item, f"{path}[{i}]", 0, GPU_MAX) for i, item in enumerate(node.value)]
    else:
        r.error(node, path, "expected auto, none or a list of GPU indices ([0, 1])")
        return None
    if any(v is None for v in values):
        return None
    if len(set(values)) != len(values) or not values:
        r.error(node, path, "expected distinct GPU indices, at least one")
        return None
    return tuple(values)


def _read_claims(r: NodeReader, node: yaml.Node, path: str) -> object:
    """claims: off | {dir: PATH, slots: N}: ("off",) or (dir, slots)."""
    if isinstance(node, yaml.ScalarNode) and (node.value in ("off", "false", "no") or
                                              node.tag.endswith(":bool") and not yaml.safe_load(node.value)):
        return ("off", None)
    entries = r.mapping(node, path, CLAIMS_KEYS)
    folder = r.string(entries["dir"][1], f"{path}.dir") if "dir" in entries else CLAIMS_DIR
    slots = r.integer(entries["slots"][1], f"{path}.slots", 1, 1 << 20) if "slots" in entries else None
    return (folder or CLAIMS_DIR, slots)


def _visible_devices(value: str) -> Optional[Tuple[int, ...]]:
    """CUDA_VISIBLE_DEVICES of a host's env: the indices it names (None for UUIDs or anything else)."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None


def _gpus_of(merged: dict, backend: str) -> Union[None, str, Tuple[int, ...]]:
    """What the host's runs may claim: gpus: as given, else the indices its env's CUDA_VISIBLE_DEVICES
    names, else every GPU with nccl and none with gloo."""
    given = merged.get("gpus")
    if given is None and "CUDA_VISIBLE_DEVICES" in merged["env"]:
        return _visible_devices(merged["env"]["CUDA_VISIBLE_DEVICES"])
    if given is None:
        return "auto" if backend == "nccl" else None
    return None if given == "none" else given


def make_host(settings: dict, defaults: dict, local_python: str, source: str,
               network: Optional[Tuple[str, str]] = None, backend: str = "gloo") -> Host:
    merged = {**defaults, **settings}
    ifname, ifname_key = settings.get("network") or network or ("auto", "")
    merged["env"] = {**defaults.get("env", {}), **settings.get("env", {})}
    connection = merged.get("connection", "ssh")
    host = merged.get("host") or ("localhost" if connection == "local" else "")
    addr = merged.get("addr") or ("127.0.0.1" if connection == "local" else None)
    # claims on by default over SSH (shared machines); a local host is this machine: on only when named
    claims = merged.get("claims") or ((CLAIMS_DIR, None) if connection == "ssh" else ("off", None))
    return Host(
        name=merged.get("name") or host, host=host, addr=addr, slots=merged.get("slots", 1),
        connection=connection, user=merged.get("user"), port=merged.get("port"),
        identity_file=merged.get("identity_file"), known_hosts=merged.get("known_hosts"),
        host_key_policy=merged.get("host_key_policy", "strict"),
        python=merged.get("python") or ("python3" if connection == "ssh" else local_python),
        workdir=merged.get("workdir", "~/.clusterrun"), env=merged["env"], proxy_jump=merged.get("proxy_jump"),
        source=source, ifname=ifname, ifname_key=ifname_key, gpus=_gpus_of(merged, backend),
        claims_dir=None if claims[0] == "off" else claims[0], claim_slots=claims[1],
        gpu_check=merged.get("gpu_check", True), gpu_devices=merged.get("gpu_devices", "/dev/nvidia*"))


def read_hosts(r: NodeReader, hnode: yaml.Node, defaults: dict, base_dir: str, local_python: str,
                read_text: Callable[[str], str], network: Optional[Tuple[str, str]] = None,
                backend: str = "gloo") -> List[Host]:
    if isinstance(hnode, yaml.ScalarNode) and hnode.tag == STR_TAG:
        path = os.path.join(base_dir, os.path.expanduser(hnode.value))
        try:
            listed = parse_hostfile(read_text(path), path)
        except OSError as exc:
            r.error(hnode, "hosts", f"cannot read hostfile {path}: {exc.strerror}")
            listed = []
        return [make_host(s, defaults, local_python, src, network, backend) for s, src in listed]
    if not isinstance(hnode, yaml.SequenceNode) or not hnode.value:
        r.error(hnode, "hosts", "expected a non-empty list of hosts (or the path of a hostfile)")
        return []
    hosts = []
    for i, item in enumerate(hnode.value):
        key = f"hosts[{i}]"
        entries = r.mapping(item, key, HOST_KEYS + HOST_ONLY_KEYS)
        settings = read_host_settings(r, entries, key)
        for name, pattern, what in (("name", NAME_RE, "host label (letters, digits, . _ -)"),
                                    ("host", HOSTNAME_RE, "host name, address or ssh alias"),
                                    ("addr", HOSTNAME_RE, "address")):
            if name in entries:
                value = r.string(entries[name][1], f"{key}.{name}", pattern=pattern, what=what)
                if value is not None:
                    settings[name] = value
        if "network" in entries:
            found = read_network(r, entries["network"][1], f"{key}.network")
            if found is not None:
                settings["network"] = found
        if "host" not in entries and {**defaults, **settings}.get("connection", "ssh") == "ssh":
            r.error(item, key, "missing required key 'host'")
        src = f"{r.file}:{item.start_mark.line + 1}:{item.start_mark.column + 1}"
        hosts.append(make_host(settings, defaults, local_python, src, network, backend))
        _check_gpus(r, item, key, {**defaults, **settings}, hosts[-1], backend)
    return hosts


def _check_gpus(r: NodeReader, item: yaml.Node, key: str, merged: dict, host: Host, backend: str) -> None:
    """gpus: and the env's CUDA_VISIBLE_DEVICES say the same thing twice; nccl wants a GPU per slot."""
    env = {**merged.get("env", {})}
    if "gpus" in merged and "CUDA_VISIBLE_DEVICES" in env:
        r.error(item, f"{key}.gpus", "both gpus: and env CUDA_VISIBLE_DEVICES are set; keep gpus: (clusterrun "
                                     "sets CUDA_VISIBLE_DEVICES to the GPUs each run claims)")
    elif isinstance(host.gpus, tuple) and backend == "nccl" and len(host.gpus) < host.slots:
        r.error(item, f"{key}.gpus", f"lists {len(host.gpus)} GPU{'s' if len(host.gpus) != 1 else ''} for slots: "
                                     f"{host.slots}; with backend nccl every rank needs a GPU of its own")


def read_network(r: NodeReader, node: yaml.Node, key: str) -> Optional[Tuple[str, str]]:
    """network: {ifname: auto | none | NAME} (top level, or a host's): (the value, its key path)."""
    entries = r.mapping(node, key, ("ifname",))
    if "ifname" not in entries:
        return None
    value = r.string(entries["ifname"][1], f"{key}.ifname")
    if value is not None and value not in IFNAME_MODES and not IFNAME_RE.match(value):
        r.error(entries["ifname"][1], f"{key}.ifname", f"{value!r} is neither auto, none nor an interface name "
                                                      "(letters, digits, _ . : @ -; at most 15)")
        return None
    return (value, f"{key}.ifname") if value is not None else None
