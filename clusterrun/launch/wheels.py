"""job.environment.wheels: controller (and auto, where a host cannot reach the index): the wheels for
the hosts' platform resolved and downloaded here, once per distinct platform, and pushed with the job
(the content-addressed push: a host that has them sends nothing, the relay passes them host to host);
the hosts then install from them with no network (`--no-index --find-links`).

Before the push, every host describes its base interpreter (hosts/client.py: describe_base: version,
implementation, platform, libc; for auto, whether the index answers there). `pip download
--only-binary=:all:` with that platform's tags fills a folder per (requirements, platform) in the state
dir, built in a temporary folder and renamed, so a second launch downloads nothing. pip downloads (uv has
no download command); the requirements file's own options (--find-links to a local folder of private
wheels, --index-url) are honoured here, where the download happens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlparse

from ..config.environment import content_key, index_settings
from ..config.inventory import Inventory
from ..errors import WheelsError

WHEELS_DIR = ".clusterrun-wheels"  # in the pushed job folder: one folder per platform tag
DEFAULT_INDEX = ("pypi.org", 443)
_NO_WHEEL = re.compile(r"(?:No matching distribution found for|satisfies the requirement)\s+(\S+)")


@dataclass(frozen=True)
class Wheels:
    """What the push carries: job-relative path → file here; and each platform tag's folder (job-relative)."""

    files: Dict[str, str]
    folders: Dict[str, str]
    downloaded: Tuple[str, ...] = ()  # the tags downloaded by this launch (the others were cached here)


def index_address(text: str) -> Tuple[str, int]:
    """Where the hosts would install from (the file's --index-url, else PyPI): for wheels: auto's test."""
    url = index_settings(text, "auto").get("index_url")
    if not url:
        return DEFAULT_INDEX
    parsed = urlparse(str(url))
    return parsed.hostname or DEFAULT_INDEX[0], parsed.port or (80 if parsed.scheme == "http" else 443)


def uses_controller(wheels: str, bases: Mapping[str, Mapping]) -> bool:
    """controller: always; auto: when any host cannot reach the index; index: never."""
    if wheels == "auto":
        return not all(b.get("index_reachable") for b in bases.values())
    return wheels == "controller"


def platform_tags(base: Mapping[str, object]) -> List[str]:
    """pip download's --platform values for a host: the manylinux tags its glibc allows, newest first,
    then the plain platform (a linux_x86_64 wheel built for it)."""
    plat = str(base.get("platform") or "")
    libc = re.match(r"glibc(\d+)\.(\d+)", str(base.get("libc") or ""))
    tags: List[str] = []
    arch = plat.split("_", 1)[1] if plat.startswith("linux_") else ""
    if arch and libc:
        major, minor = int(libc.group(1)), int(libc.group(2))
        tags += [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
        tags += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return tags + ([plat] if plat else [])


def download_argv(python: str, base: Mapping[str, object], requirements: str, dest: str) -> List[str]:
    version = str(base.get("version") or "").split(".")
    argv = [python, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--only-binary=:all:",
            "--dest", dest, "-r", requirements, "--python-version", "".join(version[:2]),
            "--implementation", str(base.get("implementation") or "cp")]
    for tag in platform_tags(base):
        argv += ["--platform", tag]
    return argv


def fetch(inv: Inventory, bases: Mapping[str, Mapping], home: str) -> Wheels:
    """The wheels for every distinct platform among the hosts' base interpreters (bases: host → its
    description), downloaded into the state dir once per (requirements, platform)."""
    env = inv.job.environment
    req_path = os.path.join(inv.job.root, env.requirements)
    with open(req_path, "rb") as fh:
        content = fh.read()
    key = content_key(content, index_settings(content.decode("utf-8", "replace"), "controller"))
    by_tag: Dict[str, Tuple[Mapping, List[str]]] = {}
    for host, base in bases.items():
        by_tag.setdefault(str(base["tag"]), (base, []))[1].append(host)
    files: Dict[str, str] = {}
    folders: Dict[str, str] = {}
    downloaded: List[str] = []
    for tag, (base, hosts) in by_tag.items():
        folder = os.path.join(home, "wheels", f"{key}-{tag}")
        if not os.path.isdir(folder):
            _download(base, req_path, inv.job.root, folder, tag, hosts)
            downloaded.append(tag)
        rel = f"{WHEELS_DIR}/{tag}"
        folders[tag] = rel
        for name in sorted(os.listdir(folder)):
            files[f"{rel}/{name}"] = os.path.join(folder, name)
    return Wheels(files, folders, tuple(downloaded))


def _download(base: Mapping, req_path: str, root: str, folder: str, tag: str, hosts: List[str]) -> None:
    os.makedirs(os.path.dirname(folder), 0o700, exist_ok=True)
    tmp = f"{folder}.part-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    argv = download_argv(sys.executable, base, req_path, tmp)
    try:
        done = subprocess.run(argv, cwd=root, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WheelsError(f"pip download for {tag} ({', '.join(hosts)}) did not finish: {exc}") from None
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-6:]
        missing = next((m.group(1) for line in tail for m in [_NO_WHEEL.search(line)] if m), None)
        what = f"no wheel of {missing} for {tag}" if missing else f"pip download for {tag} failed"
        raise WheelsError(f"{what} (the platform of {', '.join(hosts)}): " + " | ".join(tail),
                          hint="build it on the hosts with job.environment.wheels: index (where they reach an "
                               "index), or put a wheel for that platform in a --find-links folder of the "
                               "requirements file")
    os.rename(tmp, folder)


def find_links_for(wheels: Optional[Wheels], base: Mapping[str, object]) -> dict:
    """What a host's build step adds: its platform's folder in the pushed job, and no index."""
    if wheels is None:
        return {}
    return {"find_links": [wheels.folders[str(base.get("tag"))]], "no_index": True}
