"""The docker and compose clients: run a command, find the binaries, ask whether a daemon answers."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
from typing import Mapping, Sequence

from .common import ClusterError, log

def _run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 120,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run argv and capture text output; with check, raise ClusterError naming the command."""
    log.debug("run: %s", shlex.join(str(a) for a in argv))
    data = input.encode() if isinstance(input, str) else input
    try:
        cp = subprocess.run(
            [str(a) for a in argv],
            input=data,
            stdin=None if data is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=None if env is None else {**os.environ, **env},
        )
    except FileNotFoundError as exc:
        raise ClusterError(f"{argv[0]}: not installed ({exc})") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"timed out after {timeout}s: {shlex.join(str(a) for a in argv)}") from None
    cp.stdout = cp.stdout.decode(errors="replace")
    cp.stderr = cp.stderr.decode(errors="replace")
    if check and cp.returncode != 0:
        tail = (cp.stderr.strip() or cp.stdout.strip())[-2000:]
        raise ClusterError(f"failed (exit {cp.returncode}): {shlex.join(str(a) for a in argv)}\n{tail}")
    return cp


_lock = threading.RLock()
_cache: dict[str, object] = {}


def _cached(key: str, make):
    with _lock:
        if key not in _cache:
            _cache[key] = make()
        return _cache[key]


def docker_bin() -> str:
    """The docker client: $CLUSTERRUN_DOCKER, else `docker` on PATH."""
    def find() -> str:
        exe = os.environ.get("CLUSTERRUN_DOCKER") or shutil.which("docker")
        if not exe:
            raise ClusterError("docker is not installed (Debian: apt-get install docker.io docker-compose)")
        return exe
    return _cached("docker", find)


def docker_unavailable_reason() -> str | None:
    """None when a docker daemon answers; otherwise why not, in words fit for a skip reason."""
    exe = os.environ.get("CLUSTERRUN_DOCKER") or shutil.which("docker")
    if not exe:
        return "docker is not installed (no `docker` on PATH)"
    try:
        cp = subprocess.run([exe, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                            text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker daemon not reachable: {exc}"
    if cp.returncode != 0:
        msg = (cp.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"docker daemon not reachable ({exe} info: {msg})"
    return None


def docker(*args: str, **kw) -> subprocess.CompletedProcess:
    return _run([docker_bin(), *args], **kw)


def _build_argv() -> list[str]:
    """A `docker build` that speaks BuildKit (RUN --mount needs it).

    Clients from Docker 23 on build with buildx; older ones (Debian's 20.10) carry BuildKit inside.
    A new client without the buildx plugin cannot, so fall back to another client on the machine.
    """
    def find() -> list[str]:
        seen: list[str] = []
        for exe in (os.environ.get("CLUSTERRUN_DOCKER"), shutil.which("docker"), "/usr/bin/docker"):
            if not exe or not os.path.exists(exe) or os.path.realpath(exe) in seen:
                continue
            seen.append(os.path.realpath(exe))
            if _run([exe, "buildx", "version"], check=False, timeout=30).returncode == 0:
                return [exe, "build"]
            ver = _run([exe, "version", "--format", "{{.Client.Version}}"], check=False, timeout=30)
            m = re.match(r"(\d+)\.", ver.stdout.strip())
            if m and int(m.group(1)) < 23:
                return [exe, "build"]
        raise ClusterError("no docker client here can build with BuildKit: install the buildx plugin "
                           "(docker-buildx) or Debian's docker.io client")
    return list(_cached("build", find))


def compose_argv() -> list[str]:
    """`docker compose` (v2) when the plugin is there, else `docker-compose` (v1)."""
    def find() -> list[str]:
        if _run([docker_bin(), "compose", "version"], check=False, timeout=30).returncode == 0:
            return [docker_bin(), "compose"]
        v1 = shutil.which("docker-compose")
        if v1:
            return [v1]
        raise ClusterError("neither `docker compose` (v2) nor `docker-compose` (v1) is installed "
                           "(Debian: apt-get install docker-compose)")
    return list(_cached("compose", find))


def image_id(ref: str) -> str | None:
    cp = docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return cp.stdout.strip() or None if cp.returncode == 0 else None
