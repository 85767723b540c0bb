"""job.environment → a frozen Environment, every problem with file:line:col; and the pure parts of an
environment's identity: the index settings a requirements file carries, the base interpreter's name, the
key that names the venv on a host, and the stack fingerprint compared across hosts.

The key is a hash of what decides the venv's content, and of nothing else: the environment file's bytes,
the base interpreter as the host found it (its version, implementation and platform tag, reported in
the push's facts: remote/host/env/base.py), where the packages come from (wheels:, and the index options
of the file itself). Same key, same venv: a relaunch uses it as it is. The controller computes it and
hands it to the host's build step (remote/host/env/build.py), which only names the folder by it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from .yaml_nodes import NodeReader

ENVIRONMENT_KEYS = ("requirements", "python", "wheels", "allow_mismatch")
WHEELS = ("index", "controller", "auto")
# what the stack fingerprint holds, in the order tables show it (allow_mismatch names these)
FINGERPRINT_FIELDS = ("python", "torch", "cuda", "nccl", "cudnn", "driver")
VERSION_RE = re.compile(r"^3\.\d{1,2}$")
KEY_LENGTH = 16  # hex digits of the key in a venv's folder name: enough to never collide in one workdir
# index options of a requirements file (pip's own spelling, short and long)
_INDEX_OPTIONS = {"-i": "index_url", "--index-url": "index_url", "--extra-index-url": "extra_index_urls",
                  "-f": "find_links", "--find-links": "find_links", "--no-index": "no_index"}


@dataclass(frozen=True)
class Environment:
    """The job's Python environment: a venv built once per host from a pinned requirements file."""

    requirements: str  # relative POSIX path under job.root (pushed with the job)
    python: Optional[str] = None  # the base interpreter: a command or path, or a version ("3.11"); None: the host's
    wheels: str = "index"  # index: each host installs from its index | controller: wheels pushed from here | auto
    allow_mismatch: Tuple[str, ...] = ()  # fingerprint fields that may differ between hosts


def read_environment(r: NodeReader, node: Optional[yaml.Node], rel_path) -> Optional[Environment]:
    """job.environment (rel_path(node, key, value): the value as a path under job.root, or None)."""
    if node is None:
        return None
    entries = r.mapping(node, "job.environment", ENVIRONMENT_KEYS, required=("requirements",))
    if "requirements" not in entries:
        return None
    req_node = entries["requirements"][1]
    value = r.string(req_node, "job.environment.requirements")
    requirements = rel_path(req_node, "job.environment.requirements", value) if value is not None else None
    if requirements is not None and not requirements.endswith(".txt"):
        r.error(req_node, "job.environment.requirements", f"{value!r}: give a pinned requirements file (.txt), "
                "such as one `pip freeze` or `uv pip compile` writes")
        requirements = None
    python = _read_python(r, entries)
    wheels = r.choice(entries["wheels"][1], "job.environment.wheels", WHEELS) if "wheels" in entries else "index"
    allow = _read_allow(r, entries)
    if requirements is None:
        return None
    return Environment(requirements=requirements, python=python, wheels=wheels or "index", allow_mismatch=allow)


def _read_python(r: NodeReader, entries: Dict[str, Tuple[yaml.Node, yaml.Node]]) -> Optional[str]:
    if "python" not in entries:
        return None
    node = entries["python"][1]
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":float"):
        value = node.value  # python: 3.11 unquoted is a YAML number: taken as the version it means
    else:
        value = r.string(node, "job.environment.python")
    if value is not None and value[:1].isdigit() and not VERSION_RE.match(value):
        r.error(node, "job.environment.python", f"{value!r}: give a version as 3.X (\"3.11\"), or a command or "
                                                "path such as python3.11 or /opt/py/bin/python3")
        return None
    return value


def _read_allow(r: NodeReader, entries: Dict[str, Tuple[yaml.Node, yaml.Node]]) -> Tuple[str, ...]:
    if "allow_mismatch" not in entries:
        return ()

    def check(value: str) -> Optional[str]:
        if value in FINGERPRINT_FIELDS:
            return None
        close = [f for f in FINGERPRINT_FIELDS if f.startswith(value[:2])]
        return (f"{value!r} is not a fingerprint field ({', '.join(FINGERPRINT_FIELDS)})"
                + (f"; did you mean {close[0]!r}?" if close else ""))

    return tuple(r.string_list(entries["allow_mismatch"][1], "job.environment.allow_mismatch", check=check))


def base_command(env: Environment, host_python: str) -> str:
    """The base interpreter a host looks up: python: "3.11" → python3.11 on its PATH; the host's own
    python: when the environment names none."""
    if env.python is None:
        return host_python
    return f"python{env.python}" if VERSION_RE.match(env.python) else env.python


def index_settings(text: str, wheels: str) -> Dict[str, object]:
    """Where the packages come from: wheels:, and the index options written in the requirements file
    (pip honours them where it reads the file: on the host, or on the controller for wheels: controller)."""
    found: Dict[str, object] = {"wheels": wheels, "index_url": None, "extra_index_urls": [], "find_links": [],
                                "no_index": False}
    for line in text.splitlines():
        words = _option_words(line)
        for i, word in enumerate(words):
            name, _, inline = word.partition("=")
            field = _INDEX_OPTIONS.get(name)
            if field is None:
                continue
            if field == "no_index":
                found["no_index"] = True
                continue
            value = inline or (words[i + 1] if i + 1 < len(words) else "")
            if field == "index_url":
                found["index_url"] = value
            else:
                found[field].append(value)  # type: ignore[union-attr]
    return found


def _option_words(line: str) -> List[str]:
    text = line.split(" #")[0].strip()
    if not text.startswith("-"):
        return []
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def environment_key(content: bytes, base: Mapping[str, object], index: Mapping[str, object]) -> str:
    """The venv's name on a host: a hash of the file's bytes, the base interpreter as the host found it
    (version, implementation, platform tag) and the index settings."""
    digest = hashlib.sha256(content).hexdigest()
    identity = {"file": digest, "base": {k: base.get(k) for k in ("version", "implementation", "tag")},
                "index": dict(index)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:KEY_LENGTH]


def content_key(content: bytes, index: Mapping[str, object]) -> str:
    """What the controller alone knows of the key (--dry-run shows it): the file and the index settings."""
    return hashlib.sha256(content + json.dumps(dict(index), sort_keys=True).encode()).hexdigest()[:KEY_LENGTH]


_NOT_FOUND = re.compile(r"(?:No matching distribution found for|satisfies the requirement|"
                        r"Because (?:there is no version of|only))\s+([A-Za-z0-9][A-Za-z0-9._-]*)")


def failing_line(text: str, tail: Sequence[str], path: str) -> Optional[str]:
    """`requirements.txt:3: tinypkg==9.9`: the line of the file that names the requirement the installer
    could not find (pip's and uv's words in its last lines), None when it names none of them."""
    for line in tail:
        found = _NOT_FOUND.search(line)
        if not found:
            continue
        name = re.split(r"[=<>!~\[; ]", found.group(1))[0].lower().replace("_", "-")
        for number, entry in enumerate(text.splitlines(), 1):
            head = re.split(r"[=<>!~\[; ]", entry.strip())[0].lower().replace("_", "-")
            if head == name:
                return f"{path}:{number}: {entry.strip()}"
    return None


@dataclass(frozen=True)
class Mismatch:
    """One fingerprint field that differs between hosts: each host's value, the most common first."""

    field: str
    values: Tuple[Tuple[str, Tuple[str, ...]], ...]  # (value, hosts that have it), most hosts first

    def text(self) -> str:
        """"a3: torch 2.13.0+cpu, the others 2.14.1+cu124" (or each value with its hosts, when no value is
        shared by most)."""
        (common, most), rest = self.values[0], self.values[1:]
        odd = "; ".join(f"{', '.join(hosts)}: {self.field} {value}" for value, hosts in rest)
        return (f"{odd}, the others {common}" if len(most) > 1
                else f"{odd}; {', '.join(most)}: {self.field} {common}")


def mismatches(prints: Mapping[str, Mapping[str, Optional[str]]], allowed: Sequence[str] = ()
               ) -> List[Mismatch]:
    """The fingerprint fields whose values differ between hosts (prints: host → its fingerprint), less the
    allowed ones; a field no host has (no GPU: driver) is no difference."""
    out = []
    for field in FINGERPRINT_FIELDS:
        if field in allowed:
            continue
        by_value: Dict[str, List[str]] = {}
        for host, fp in prints.items():
            by_value.setdefault(str(fp.get(field) or "none"), []).append(host)
        if len(by_value) > 1:
            ordered = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[0]))
            out.append(Mismatch(field, tuple((v, tuple(h)) for v, h in ordered)))
    return out
