"""Constants, the error type and the records shared by the test cluster's modules."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

log = logging.getLogger("testcluster")

DOCKER_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = DOCKER_DIR.parent
CLUSTER_ROOT = Path(os.environ.get("CLUSTERRUN_CLUSTER_DIR") or REPO_ROOT / ".cluster").resolve()

DEFAULT_NAME = "demo"
DEFAULT_HOSTS = 4
DEFAULT_SUBNET = "198.18.200.0/24"
FIRST_HOST_OFFSET = 10  # node i lives at subnet .10+i; .1 is the bridge's gateway
USER = "cr"
MASTER_PORT = 29500
CONTAINER_PYTHON = "/opt/venv/bin/python"

IMAGE_REPO = "clusterrun/host"
LOCAL_BASE_IMAGE = "clusterrun/base:bookworm"  # made with debootstrap where no registry answers
REGISTRY_BASE_IMAGE = "debian:bookworm-slim"
LABEL = "org.clusterrun.cluster"
# bookworm's python3 is 3.11: the wheelhouse is fetched for it, whatever Python runs this file.
WHEEL_PYTHON = ("3.11", "cp311")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_SESSION_RE = re.compile(r"^sshd(-session)?: " + USER + r"[@ ]")


def _typed(path: Path, absolute: bool = False) -> str:
    """A path as a person types it from here: relative when it is under this folder (unless absolute)."""
    if absolute:
        return str(path)
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else (rel if os.sep in rel else f".{os.sep}{rel}")


def commands(absolute: bool = False) -> dict:
    """The command lines a person can paste here: `testcluster` through the Python that runs it, and
    `clusterrun` as the console script beside that Python (a venv's bin/), else on PATH, else as
    `python -m clusterrun` (neither needs an activated venv)."""
    python = _typed(Path(sys.executable), absolute)
    beside = Path(sys.executable).parent / "clusterrun"
    if beside.exists():
        clusterrun = _typed(beside, absolute)
    elif shutil.which("clusterrun"):
        clusterrun = "clusterrun"
    else:
        clusterrun = f"{python} -m clusterrun"
    return {"testcluster": f"{python} {shlex.quote(_typed(DOCKER_DIR / 'testcluster', absolute))}",
            "clusterrun": clusterrun}


class ClusterError(RuntimeError):
    """Anything the cluster could not do; the message says what and how to fix it."""


@dataclasses.dataclass(frozen=True)
class HostInfo:
    name: str        # node0 .. node{N-1}: the hostname inside the container, and the inventory name
    address: str     # fixed address on the cluster's bridge network
    container: str   # docker container name: <cluster>-<name>
    address2: str = ""  # on the second network, where the cluster has one (Cluster(second_subnet=...))


@dataclasses.dataclass(frozen=True)
class Proc:
    host: str
    pid: int
    ppid: int
    pgid: int
    stat: str
    args: str

    def __str__(self) -> str:
        return f"{self.host} pid={self.pid} ppid={self.ppid} pgid={self.pgid} [{self.stat}] {self.args}"
