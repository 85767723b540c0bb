#!/usr/bin/env python3
"""A cluster of docker containers posing as SSH hosts, to try and to test clusterrun on one machine.

    python docker/testcluster.py up [--hosts N] [--name NAME] [--subnet 198.18.200.0/24]
    python docker/testcluster.py status [--name NAME] [--json]
    python docker/testcluster.py ssh [--name NAME] node1 [COMMAND...]
    python docker/testcluster.py down [--name NAME]
    python docker/testcluster.py build [--force]        # the image only (CI warms its cache with it)
    python docker/testcluster.py clean [--all]          # remove the images (and the base image)

`up` builds the image when its inputs changed (otherwise it is reused as is), starts N hosts named
node0..node{N-1} at .10+i of the subnet, waits until each accepts a real SSH login with the test key
under strict host-key checking, and writes `.cluster/NAME/`: id_ed25519(.pub), known_hosts,
docker-compose.yml, inventory.yaml (clusterrun's inventory format v1), ssh_config, state.json, and the
directory `shared/` that every host mounts at /shared.

From Python (the tests use this): ``Cluster(name).up()``, then ``exec``, ``processes``, ``orphans`` and
the faults ``crash``/``start``, ``pause``/``unpause``, ``partition``/``heal``, ``block``/``unblock``,
and ``restore()`` to undo all of them. Stdlib only (PyYAML, when present, double-checks the inventory).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

log = logging.getLogger("testcluster")

DOCKER_DIR = Path(__file__).resolve().parent
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


class ClusterError(RuntimeError):
    """Anything the cluster could not do; the message says what and how to fix it."""


# --------------------------------------------------------------------------------------------------
# docker and compose clients


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


# --------------------------------------------------------------------------------------------------
# the image: base, wheelhouse, build


def _say(quiet: bool, msg: str) -> None:
    log.info("%s", msg)
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def ensure_base_image(quiet: bool = False) -> str:
    """The image to build on: $CLUSTERRUN_BASE_IMAGE, else debian:bookworm-slim, else debootstrap.

    With no registry (the CI machine) the base is made once with debootstrap and `docker import`,
    and kept as clusterrun/base:bookworm; later builds find it and do nothing.
    """
    wanted = os.environ.get("CLUSTERRUN_BASE_IMAGE", "").strip()
    if wanted and wanted != "debootstrap":
        if not image_id(wanted):
            docker("pull", wanted, timeout=600)
        return wanted
    if image_id(LOCAL_BASE_IMAGE):
        return LOCAL_BASE_IMAGE
    if not wanted:
        if image_id(REGISTRY_BASE_IMAGE):
            return REGISTRY_BASE_IMAGE
        _say(quiet, f"pulling {REGISTRY_BASE_IMAGE} ...")
        cp = docker("pull", REGISTRY_BASE_IMAGE, check=False, timeout=300)
        if cp.returncode == 0:
            return REGISTRY_BASE_IMAGE
        _say(quiet, f"no registry ({cp.stderr.strip().splitlines()[-1:] or '?'}); "
                    f"making {LOCAL_BASE_IMAGE} with debootstrap instead")
    _debootstrap_base(quiet)
    return LOCAL_BASE_IMAGE


def _debootstrap_base(quiet: bool) -> None:
    if not shutil.which("debootstrap"):
        raise ClusterError("no registry and no debootstrap: apt-get install debootstrap "
                           "(or set CLUSTERRUN_BASE_IMAGE to a Debian 12 image you have)")
    if os.geteuid() != 0:
        raise ClusterError("debootstrap needs root: run `sudo python docker/testcluster.py build` once "
                           "(or set CLUSTERRUN_BASE_IMAGE to a Debian 12 image you have)")
    mirror = os.environ.get("CLUSTERRUN_DEBIAN_MIRROR")  # default: debootstrap's own (deb.debian.org)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clusterrun-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        argv = ["debootstrap", "--variant=minbase", "bookworm", str(root)] + ([mirror] if mirror else [])
        _say(quiet, "debootstrap bookworm (about 30-50 s) ...")
        _run(argv, timeout=1800)
        # Not needed in an image and only noise in its layers.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            for p in (root / sub).glob("*"):
                if p.is_file() or p.is_symlink():
                    p.unlink()
                elif p.is_dir() and p.name != "partial":
                    shutil.rmtree(p)
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            imp = subprocess.run([docker_bin(), "import", "--change", 'CMD ["/bin/bash"]', "-",
                                  LOCAL_BASE_IMAGE], stdin=tar.stdout, capture_output=True, text=True)
        finally:
            tar.stdout.close()
            tar.wait()
        if imp.returncode != 0 or tar.returncode != 0:
            raise ClusterError(f"docker import of the debootstrap tree failed: {imp.stderr.strip()}")
    _say(quiet, f"made {LOCAL_BASE_IMAGE} in {time.monotonic() - t0:.0f} s")


def _torch_requirement() -> str:
    # The CPU-only wheels: "+cpu" on x86_64 (download.pytorch.org), plain on aarch64 (PyPI).
    return "torch==2.13.0+cpu" if platform.machine() in ("x86_64", "AMD64") else "torch==2.13.0"


def _wheel_platforms() -> list[str]:
    arch = "x86_64" if platform.machine() in ("x86_64", "AMD64") else "aarch64"
    return [f"manylinux_2_{m}_{arch}" for m in (28, 27, 17)] + [f"manylinux2014_{arch}"]


def wheelhouse_dir() -> Path:
    return Path(os.environ.get("CLUSTERRUN_WHEELHOUSE") or CLUSTER_ROOT / "wheelhouse").resolve()


def ensure_wheelhouse(quiet: bool = False) -> Path:
    """Wheels for the containers' venv, fetched on this machine (containers may have no HTTPS).

    Kept across runs; fetched again only when the requirements change. The plain pip indexes are
    tried first (a local mirror or find-links may hold the CPU wheel), then PyTorch's CPU index.
    """
    wh = wheelhouse_dir()
    reqs = f"{_torch_requirement()}\nnumpy\n"
    req_file = wh / "requirements.txt"
    if req_file.is_file() and req_file.read_text() == reqs and any(wh.glob("torch-*.whl")):
        return wh
    wh.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=wh.parent))
    base = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "-d", str(tmp),
            "--only-binary=:all:", "--implementation", "cp", "--python-version", WHEEL_PYTHON[0],
            "--abi", WHEEL_PYTHON[1]]
    for plat in _wheel_platforms():
        base += ["--platform", plat]
    base += reqs.split()
    _say(quiet, f"fetching the wheelhouse ({_torch_requirement()}, numpy) into {wh} ...")
    cp = _run(base, check=False, timeout=1800)
    if cp.returncode != 0:
        log.info("plain pip download failed, trying %s: %s", TORCH_CPU_INDEX, cp.stderr[-500:])
        cp = _run(base + ["--extra-index-url", TORCH_CPU_INDEX], check=False, timeout=1800)
    if cp.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ClusterError(f"pip download of the wheelhouse failed:\n{cp.stderr.strip()[-2000:]}")
    (tmp / "requirements.txt").write_text(reqs)
    os.chmod(tmp, 0o755)
    if wh.exists():
        shutil.rmtree(wh)
    os.replace(tmp, wh)
    return wh


def _image_inputs(base_id: str, wh: Path) -> tuple[str, list[tuple[Path, str]]]:
    """A hash of everything that goes into the image, and the files of the build context."""
    h = hashlib.sha256()
    h.update(base_id.encode())
    h.update((DOCKER_DIR / "Dockerfile").read_bytes())
    files: list[tuple[Path, str]] = []
    for p in sorted((DOCKER_DIR / "rootfs").rglob("*")):
        if p.is_file():
            rel = "rootfs/" + p.relative_to(DOCKER_DIR / "rootfs").as_posix()
            files.append((p, rel))
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    for p in sorted(wh.iterdir()):
        if p.is_file():
            files.append((p, "wheelhouse/" + p.name))
            # Wheels are immutable by name; the size guards against a truncated download.
            h.update(f"{p.name}\0{p.stat().st_size}\0".encode())
    h.update((wh / "requirements.txt").read_bytes())
    return h.hexdigest()[:12], files


def build_image(force: bool = False, quiet: bool = False) -> str:
    """Build clusterrun/host:<hash of its inputs> unless it exists; return the tag.

    One build at a time on this checkout (a lock file): a test session and a person's `up` may race.
    """
    CLUSTER_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER_ROOT / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_image_locked(force, quiet)


def _build_image_locked(force: bool, quiet: bool) -> str:
    base = ensure_base_image(quiet)
    base_id = image_id(base) or base
    wh = ensure_wheelhouse(quiet)
    digest, files = _image_inputs(base_id, wh)
    tag = f"{IMAGE_REPO}:{digest}"
    if not force and image_id(tag):
        return tag
    ctx = Path(tempfile.mkdtemp(prefix=".build-", dir=CLUSTER_ROOT))
    for src, rel in files:
        dst = ctx / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)  # the wheels are big: link, do not copy
        except OSError:
            shutil.copy2(src, dst)
        if rel.startswith("rootfs/"):
            os.chmod(dst, src.stat().st_mode)
    argv = _build_argv() + ["--progress=plain", "-f", str(DOCKER_DIR / "Dockerfile"),
                            "--build-arg", f"BASE_IMAGE={base}", "--label", f"{LABEL}.inputs={digest}",
                            "-t", tag, "-t", f"{IMAGE_REPO}:latest", str(ctx)]
    _say(quiet, f"building {tag} on {base} ...")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "DOCKER_BUILDKIT": "1"}, stdin=subprocess.DEVNULL)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if not quiet:
            sys.stderr.write(line)
    proc.wait()
    shutil.rmtree(ctx, ignore_errors=True)
    if proc.returncode != 0:
        tail = "".join(lines[-40:])
        raise ClusterError(f"image build failed (exit {proc.returncode}): {shlex.join(argv)}\n{tail}")
    _say(quiet, f"built {tag} in {time.monotonic() - t0:.1f} s")
    # Older builds go, except those a container still uses (docker refuses those; fine).
    old = [r for r in docker("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO).stdout.split()
           if r not in (tag, f"{IMAGE_REPO}:latest")]
    if old:
        docker("rmi", *old, check=False)
    return tag


def remove_images(include_base: bool = False) -> list[str]:
    """Remove every clusterrun/host image (and the debootstrap base); return what was removed."""
    refs = docker("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO).stdout.split()
    if include_base and image_id(LOCAL_BASE_IMAGE):
        refs.append(LOCAL_BASE_IMAGE)
    if refs:
        docker("rmi", *refs, check=False)
    return refs


# --------------------------------------------------------------------------------------------------
# the cluster


@dataclasses.dataclass(frozen=True)
class HostInfo:
    name: str        # node0 .. node{N-1}: the hostname inside the container, and the inventory name
    address: str     # fixed address on the cluster's bridge network
    container: str   # docker container name: <cluster>-<name>


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


class Cluster:
    """One named cluster: its containers, its network and its state directory .cluster/NAME/."""

    def __init__(self, name: str = DEFAULT_NAME, hosts: int | None = None, subnet: str | None = None,
                 *, quiet: bool = True):
        if not _NAME_RE.match(name) or name == "wheelhouse":
            raise ClusterError(f"cluster name {name!r}: use 1-40 of a-z 0-9 _ - (starting alnum), "
                               "not 'wheelhouse'")
        self.name = name
        self.quiet = quiet
        self.state_dir = CLUSTER_ROOT / name
        saved = self._load_state()
        n = hosts if hosts is not None else int(saved.get("hosts", DEFAULT_HOSTS))
        net = ipaddress.ip_network(subnet or saved.get("subnet", DEFAULT_SUBNET), strict=True)
        if net.version != 4:
            raise ClusterError(f"subnet {net}: IPv4 only")
        if n < 1 or FIRST_HOST_OFFSET + n > net.num_addresses - 1:
            raise ClusterError(f"{n} hosts do not fit in {net} (node i is at .{FIRST_HOST_OFFSET}+i)")
        self.subnet = net
        self.network = f"{name}-net"
        self.hosts = [HostInfo(f"node{i}", str(net.network_address + FIRST_HOST_OFFSET + i),
                               f"{name}-node{i}") for i in range(n)]
        self._by_key = {k: h for h in self.hosts for k in (h.name, h.address, h.container)}
        self._blocked: dict[str, set[str]] = {}
        self.timings: dict[str, float] = {}  # of the last up(): image, compose, ssh, total (seconds)

    # paths ----------------------------------------------------------------------------------------
    key_path = property(lambda self: self.state_dir / "id_ed25519")
    known_hosts_path = property(lambda self: self.state_dir / "known_hosts")
    inventory_path = property(lambda self: self.state_dir / "inventory.yaml")
    compose_path = property(lambda self: self.state_dir / "docker-compose.yml")
    ssh_config_path = property(lambda self: self.state_dir / "ssh_config")
    shared_dir = property(lambda self: self.state_dir / "shared")
    hostkeys_dir = property(lambda self: self.state_dir / "hostkeys")
    state_path = property(lambda self: self.state_dir / "state.json")

    def host(self, host: str | HostInfo) -> HostInfo:
        """A host by name (node1), address or container name."""
        if isinstance(host, HostInfo):
            return host
        try:
            return self._by_key[host]
        except KeyError:
            raise ClusterError(f"no host {host!r} in cluster {self.name!r} "
                               f"(hosts: {', '.join(h.name for h in self.hosts)})") from None

    def _load_state(self) -> dict:
        try:
            return json.loads((self.state_dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    # lifecycle ------------------------------------------------------------------------------------
    def up(self, timeout: float = 120.0) -> "Cluster":
        """Build (cached), start every host, wait for SSH logins, write the inventory."""
        t0 = time.monotonic()
        image = build_image(quiet=self.quiet)
        fresh = not self.state_dir.exists()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for d in (self.shared_dir, self.hostkeys_dir):
            d.mkdir(exist_ok=True)
        os.chmod(self.shared_dir, 0o777)  # the hosts' user cr (uid 1000) writes here, whoever we are
        self._ensure_key()
        self._write_atomic(self.compose_path, self.compose_yaml(image))
        existed = self._unpause_all()  # compose cannot stop or recreate a paused container
        t1 = time.monotonic()
        cp = self._compose("up", "-d", "--remove-orphans", check=False, timeout=600)
        if cp.returncode != 0:
            err = cp.stderr.strip()
            if fresh and not any(self._states().values()):
                shutil.rmtree(self.state_dir, ignore_errors=True)
            if "overlaps" in err or "Pool overlaps" in err:
                raise ClusterError(f"subnet {self.subnet} is taken by another docker network (another "
                                   f"cluster?): pass --subnet, e.g. 198.18.201.0/24\n{err[-800:]}")
            raise ClusterError(f"compose up failed for cluster {self.name!r}:\n{err[-2000:]}")
        self._write_atomic(self.state_path, json.dumps({
            "version": 1, "name": self.name, "hosts": len(self.hosts), "subnet": str(self.subnet),
            "image": image, "network": self.network, "compose": compose_argv()}, indent=2) + "\n")
        if existed:
            # compose leaves a running container alone, even one a partition() cut off: repair those.
            self.restore(wait=False, deep=True)
        t2 = time.monotonic()
        self.wait_ready(timeout=timeout)
        self._write_atomic(self.inventory_path, self.inventory_yaml())
        self._write_atomic(self.ssh_config_path, self.ssh_config())
        t3 = time.monotonic()
        self.timings = {"image": t1 - t0, "compose": t2 - t1, "ssh": t3 - t2, "total": t3 - t0}
        log.info("cluster %s up: %s", self.name, self.timings)
        return self

    def down(self) -> None:
        """Remove the containers, the network and .cluster/NAME/ (the test key included)."""
        if self.compose_path.exists():
            self._unpause_all()
            # Files the hosts' cr wrote under /shared may not be ours to delete here: empty it inside.
            states = self._states()
            running = [h for h in self.hosts if states.get(h.container, {}).get("Status") == "running"]
            if running:
                self.exec(running[0], ["find", "/shared", "-mindepth", "1", "-delete"], user="root", timeout=60)
            self._compose("down", "-v", "--remove-orphans", "-t", "1", check=False, timeout=300)
        # Whatever compose did not know about (a lost compose file, more hosts than it lists).
        left = docker("ps", "-aq", "--filter", f"label={LABEL}={self.name}", check=False).stdout.split()
        if left:
            docker("rm", "-f", *left, check=False)
        if docker("network", "inspect", self.network, check=False).returncode == 0:
            docker("network", "rm", self.network, check=False)
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)

    def healthy(self, timeout: float = 10.0) -> bool:
        """Every host running, attached, and accepting the test key under strict host-key checking."""
        saved = self._load_state()
        if not saved or saved.get("hosts") != len(self.hosts) or saved.get("subnet") != str(self.subnet):
            return False
        if not all(p.exists() for p in (self.key_path, self.known_hosts_path, self.inventory_path)):
            return False
        states = self._states()
        for h in self.hosts:
            st = states.get(h.container)
            if not st or st["Status"] != "running" or self.network not in st["Networks"]:
                return False
            if st["Image"] != saved.get("image"):
                return False
        res = self._ssh_all(self.hosts, ["hostname"], timeout=timeout)
        return all(rc == 0 and out.strip() == h.name for h, (rc, out, _) in zip(self.hosts, res))

    def image_current(self) -> bool:
        """Whether the running cluster's image and compose file are what the current sources make."""
        saved = self._load_state()
        try:
            image = build_image(quiet=True)
        except ClusterError:
            return False
        try:
            compose = self.compose_path.read_text()
        except OSError:
            return False
        return saved.get("image") == image and compose == self.compose_yaml(image)

    def status(self) -> list[dict]:
        states = self._states()
        rows = []
        alive = [h for h in self.hosts if states.get(h.container, {}).get("Status") == "running"
                 and self.network in states[h.container]["Networks"]]
        logins = dict(zip([h.name for h in alive], self._ssh_all(alive, ["true"], timeout=5))) \
            if self.known_hosts_path.exists() else {}
        for h in self.hosts:
            st = states.get(h.container)
            rows.append({
                "name": h.name, "address": h.address, "container": h.container,
                "state": st["Status"] if st else "missing",
                "network": bool(st and self.network in st["Networks"]),
                "ssh": h.name in logins and logins[h.name][0] == 0,
            })
        return rows

    # readiness ------------------------------------------------------------------------------------
    def wait_ready(self, hosts: Iterable[str | HostInfo] | None = None, timeout: float = 60.0) -> float:
        """Wait until each host accepts an SSH login with the test key; return the seconds it took.

        A TCP connect is not enough (docker's proxy or a half-started sshd accept it). Host keys are
        read from what each container published at start, refreshed while we wait (a recreated
        container has a new key), and the login is checked against them, strictly.
        """
        t0 = time.monotonic()
        pending = [self.host(h) for h in (hosts if hosts is not None else self.hosts)]
        last_err: dict[str, str] = {}
        while pending:
            self._refresh_known_hosts()
            res = self._ssh_all(pending, ["hostname"], timeout=5)
            still = []
            for h, (rc, out, err) in zip(pending, res):
                if rc == 0 and out.strip() == h.name:
                    continue
                still.append(h)
                last_err[h.name] = (err.strip() or out.strip() or f"exit {rc}")[-300:]
            pending = still
            if not pending:
                break
            if time.monotonic() - t0 > timeout:
                states = self._states()
                lines = []
                for h in pending:
                    st = states.get(h.container, {}).get("Status", "missing")
                    logs = docker("logs", "--tail", "5", h.container, check=False)
                    lines.append(f"  {h.name} ({h.address}, container {st}): {last_err.get(h.name)}\n"
                                 f"    docker logs: {(logs.stdout + logs.stderr).strip()[-400:]}")
                raise ClusterError(f"cluster {self.name!r}: no SSH login after {timeout:.0f} s on\n"
                                   + "\n".join(lines))
            time.sleep(0.1)
        return time.monotonic() - t0

    def _refresh_known_hosts(self) -> None:
        lines = []
        for h in self.hosts:
            p = self.hostkeys_dir / f"{h.name}.pub"
            try:
                keytype, b64 = p.read_text().split()[:2]
            except (OSError, ValueError):
                continue
            lines.append(f"{h.address} {keytype} {b64}\n")
        text = "".join(lines)
        try:
            if self.known_hosts_path.read_text() == text:
                return
        except OSError:
            pass
        self._write_atomic(self.known_hosts_path, text)

    def ssh_argv(self, host: str | HostInfo, command: Sequence[str] | str = (), *,
                 connect_timeout: float = 5) -> list[str]:
        """An OpenSSH command line that logs in as cr with the test key, host keys checked strictly."""
        h = self.host(host)
        argv = ["ssh", "-F", "/dev/null", "-i", str(self.key_path), "-l", USER,
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts_path}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", f"ConnectTimeout={max(1, int(connect_timeout))}", "-o", "LogLevel=ERROR", h.address]
        if command:
            argv += ["--", command if isinstance(command, str) else shlex.join(command)]
        return argv

    def ssh(self, host: str | HostInfo, command: Sequence[str] | str, timeout: float = 60,
            input: str | None = None) -> tuple[int, str, str]:
        """Run a command over a real SSH login; return (rc, stdout, stderr); rc 255 is ssh's own."""
        try:
            cp = _run(self.ssh_argv(host, command, connect_timeout=min(timeout, 5)), check=False,
                      timeout=timeout, input=input)
        except ClusterError as exc:  # the timeout
            return 255, "", str(exc)
        return cp.returncode, cp.stdout, cp.stderr

    def _ssh_all(self, hosts: Sequence[HostInfo], command: Sequence[str], timeout: float):
        if not hosts:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            return list(pool.map(lambda h: self.ssh(h, command, timeout=timeout), hosts))

    # processes ------------------------------------------------------------------------------------
    def exec(self, host: str | HostInfo, argv: Sequence[str], user: str = USER,
             timeout: float | None = 60, input: str | None = None) -> tuple[int, str, str]:
        """`docker exec` argv on a host as cr or root (no SSH involved); return (rc, stdout, stderr)."""
        h = self.host(host)
        cmd = [docker_bin(), "exec"] + (["-i"] if input is not None else []) + ["-u", user]
        if user == USER:
            cmd += ["-w", f"/home/{USER}", "-e", f"HOME=/home/{USER}"]
        try:
            cp = _run(cmd + [h.container, *argv], check=False, timeout=timeout, input=input)
        except ClusterError as exc:  # the timeout
            return 124, "", str(exc)
        return cp.returncode, cp.stdout, cp.stderr

    def processes(self, host: str | HostInfo) -> list[Proc]:
        """Every process of user cr on the host, sshd's session processes included."""
        h = self.host(host)
        rc, out, err = self.exec(h, ["ps", "-u", USER, "-o", "pid=,ppid=,pgid=,stat=,args="],
                                 user="root", timeout=30)
        if rc not in (0, 1):  # ps exits 1 when it selected nothing
            raise ClusterError(f"{h.name}: ps failed (exit {rc}): {err.strip()}")
        procs = []
        for line in out.splitlines():
            parts = line.split(None, 4)
            if len(parts) < 4:
                continue
            pid, ppid, pgid, stat = parts[:4]
            procs.append(Proc(h.name, int(pid), int(ppid), int(pgid), stat, parts[4] if len(parts) > 4 else ""))
        return procs

    def orphans(self, hosts: Iterable[str | HostInfo] | None = None) -> list[Proc]:
        """Processes of cr left on the hosts, except sshd's own session processes.

        Hosts that are not running (crashed) or paused are skipped: nothing can be asked of them.
        """
        states = self._states()
        targets = [self.host(h) for h in (hosts if hosts is not None else self.hosts)]
        targets = [h for h in targets if states.get(h.container, {}).get("Status") == "running"]
        if not targets:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
            per_host = list(pool.map(self.processes, targets))
        return [p for procs in per_host for p in procs if not _SESSION_RE.match(p.args)]

    def kill(self, host: str | HostInfo, pids: Iterable[int], signal: str = "KILL") -> None:
        """Signal processes on a host by pid (as root), ignoring those already gone."""
        pids = [str(int(p)) for p in pids]
        if pids:
            self.exec(host, ["kill", "-s", signal, "--", *pids], user="root", timeout=30)

    # faults ---------------------------------------------------------------------------------------
    def crash(self, host: str | HostInfo) -> None:
        """Kill the whole host at once (SIGKILL to every process: a power cut)."""
        docker("kill", self.host(host).container)

    def start(self, host: str | HostInfo, wait: bool = True) -> None:
        """Start a crashed host again (same address, same host key) and wait for its sshd."""
        h = self.host(host)
        docker("start", h.container)
        if wait:
            self.wait_ready([h])

    def pause(self, host: str | HostInfo) -> None:
        """Freeze every process of the host: TCP stays open, nothing answers (a hung machine)."""
        for attempt in range(5):
            try:
                docker("pause", self.host(host).container)
                return
            except ClusterError as exc:
                # the cgroup freezer gives up ("unable to freeze") while processes are being created
                if "unable to freeze" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.05)

    def unpause(self, host: str | HostInfo) -> None:
        docker("unpause", self.host(host).container)

    def partition(self, host: str | HostInfo) -> None:
        """Cut the host off the network (from the controller and from every other host)."""
        docker("network", "disconnect", "--force", self.network, self.host(host).container)

    def heal(self, host: str | HostInfo, wait: bool = True) -> None:
        """Reconnect a partitioned host at its own address (the interface comes back as eth1)."""
        h = self.host(host)
        docker("network", "connect", "--ip", h.address, "--alias", h.name, self.network, h.container)
        if wait:
            self.wait_ready([h])

    def block(self, host: str | HostInfo, peer: str | HostInfo) -> None:
        """Drop traffic from host to peer only (a blackhole route on host); the controller still reaches both."""
        h, p = self.host(host), self.host(peer)
        rc, _, err = self.exec(h, ["ip", "route", "replace", "blackhole", f"{p.address}/32"], user="root")
        if rc != 0:
            raise ClusterError(f"{h.name}: cannot block {p.name}: {err.strip()}")
        self._blocked.setdefault(h.name, set()).add(p.address)

    def unblock(self, host: str | HostInfo, peer: str | HostInfo | None = None) -> None:
        h = self.host(host)
        blocked = self._blocked.get(h.name, set())
        for addr in ([self.host(peer).address] if peer is not None else sorted(blocked)):
            self.exec(h, ["ip", "route", "del", "blackhole", addr], user="root")
            blocked.discard(addr)

    def restore(self, timeout: float = 60.0, *, wait: bool = True, deep: bool = False) -> list[str]:
        """Undo every fault: unpause, start, reconnect, unblock; wait for SSH on what was touched.

        Looks at docker's view of each container rather than trusting what this object did, so it
        also repairs faults made by another process; `deep` also looks for blackhole routes on
        every host (block() by another process; a docker exec per host). Returns the hosts repaired.
        """
        states = self._states()
        if deep:
            running = [h for h in self.hosts if states.get(h.container, {}).get("Status") == "running"]
            show = ["ip", "-o", "route", "show", "type", "blackhole"]
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(running)))) as pool:
                found = list(pool.map(lambda h: self.exec(h, show, user="root"), running))
            for h, (rc, out, _) in zip(running, found):
                for line in out.splitlines() if rc == 0 else []:
                    self._blocked.setdefault(h.name, set()).add(line.split()[1])
        touched: list[HostInfo] = []
        for h in self.hosts:
            st = states.get(h.container)
            if st is None:
                if not wait:
                    continue
                raise ClusterError(f"{h.name}: container {h.container} is gone; run `up` again")
            fixed = False
            if st["Status"] == "paused":
                docker("unpause", h.container)
                fixed = True
            elif st["Status"] != "running":
                docker("start", h.container)
                fixed = True
            if self.network not in st["Networks"]:
                self.heal(h, wait=False)
                fixed = True
            elif st["Status"] == "running" and st["Networks"][self.network] != h.address:
                raise ClusterError(f"{h.name}: at {st['Networks'][self.network]}, expected {h.address}")
            if self._blocked.get(h.name):
                self.unblock(h)
                fixed = True
            if fixed:
                touched.append(h)
        if touched and wait:
            self.wait_ready(touched, timeout=timeout)
        return [h.name for h in touched]

    # internals ------------------------------------------------------------------------------------
    def _states(self) -> dict[str, dict]:
        """container name -> {Status, Image, Networks: {network: address}} for this cluster's hosts."""
        names = [h.container for h in self.hosts]
        fmt = ('{"Name": {{json .Name}}, "Status": {{json .State.Status}}, "Image": {{json .Config.Image}}, '
               '"Networks": {{json .NetworkSettings.Networks}}}')
        cp = docker("inspect", "--format", fmt, *names, check=False, timeout=60)
        out: dict[str, dict] = {}
        for line in cp.stdout.splitlines():
            if not line.strip():
                continue
            d = json.loads(line)
            nets = {k: (v or {}).get("IPAddress", "") for k, v in (d["Networks"] or {}).items()}
            out[d["Name"].lstrip("/")] = {"Status": d["Status"], "Image": d["Image"], "Networks": nets}
        return out

    def _unpause_all(self) -> bool:
        """Unpause this cluster's paused containers; return whether it has any container at all."""
        states = self._states()
        for name, st in states.items():
            if st["Status"] == "paused":
                docker("unpause", name, check=False)
        return bool(states)

    def _compose(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return _run(compose_argv() + ["-p", self.name, "-f", str(self.compose_path), *args], **kw)

    def _ensure_key(self) -> None:
        if self.key_path.exists() and self.key_path.with_suffix(".pub").exists():
            return
        for p in (self.key_path, self.key_path.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"clusterrun-test@{self.name}",
              "-f", str(self.key_path)])
        os.chmod(self.key_path, 0o600)

    @staticmethod
    def _write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # generated files ------------------------------------------------------------------------------
    def compose_yaml(self, image: str) -> str:
        """The compose file (format 2.4, understood by compose v1 and v2). JSON strings are YAML."""
        q = json.dumps
        pubkey = self.key_path.with_suffix(".pub").read_text().strip()
        gateway = str(self.subnet.network_address + 1)
        out = [f"# Generated by docker/testcluster.py for cluster {self.name!r}; `down` removes it.",
               'version: "2.4"', "services:"]
        for h in self.hosts:
            others = [f"{o.name}:{o.address}" for o in self.hosts if o is not h]
            out += [
                f"  {h.name}:",
                f"    image: {q(image)}",
                f"    container_name: {q(h.container)}",
                f"    hostname: {q(h.name)}",
                f"    labels: {{{q(LABEL)}: {q(self.name)}, {q(LABEL + '.host')}: {q(h.name)}}}",
                f"    environment: {{CR_AUTHORIZED_KEYS: {q(pubkey)}}}",
                "    volumes:",
                f"      - {q(str(self.shared_dir) + ':/shared')}",
                f"      - {q(str(self.hostkeys_dir) + ':/clusterrun/hostkeys')}",
                "    networks:",
                f"      cluster: {{ipv4_address: {q(h.address)}, aliases: [{q(h.name)}]}}",
                f"    extra_hosts: {q(others)}",
                "    cap_add: [NET_ADMIN]  # for block(): a blackhole route between two hosts",
                # a small disk for disk-full tests: 4 MB and 200 inodes, owned by cr
                f"    tmpfs: [{q('/small:size=4m,nr_inodes=200,uid=1000,gid=1000,mode=0700')}]",
                "    stop_grace_period: 1s",
            ]
        out += [
            "networks:",
            "  cluster:",
            f"    name: {q(self.network)}",
            "    driver: bridge",
            f"    labels: {{{q(LABEL)}: {q(self.name)}}}",
            "    ipam:",
            f"      config: [{{subnet: {q(str(self.subnet))}, gateway: {q(gateway)}}}]",
        ]
        return "\n".join(out) + "\n"

    def inventory_data(self) -> dict:
        return {
            "version": 1,
            "defaults": {
                "user": USER,
                "port": 22,
                "identity_file": str(self.key_path),
                "known_hosts": str(self.known_hosts_path),
                "host_key_policy": "strict",
                "python": CONTAINER_PYTHON,
                "workdir": "~/.clusterrun",
                "connection": "ssh",
                "env": {"OMP_NUM_THREADS": "1"},
            },
            "hosts": [{"name": h.name, "host": h.address} for h in self.hosts],
            "master": {"port": MASTER_PORT},
            "job": {
                "root": str(REPO_ROOT),
                "script": "train_job/train.py",
                "args": ["--epochs", "1", "--synthetic", "--data-dir", "data"],
                "sync": ["train_job/"],
                "init_method": "env",
                "backend": "gloo",
                "timeout": "5m",
                "shared_dir": "/shared",
            },
        }

    def inventory_yaml(self) -> str:
        """clusterrun's inventory v1 for this cluster, laid out as people write it."""
        d = self.inventory_data()

        def s(v) -> str:
            if isinstance(v, bool) or v is None:
                raise TypeError(v)
            if isinstance(v, int):
                return str(v)
            if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_./~][A-Za-z0-9_./~-]*", v) \
                    and not re.fullmatch(r"[0-9.]+|~|true|false|yes|no|on|off|null", v, re.I):
                return v
            return json.dumps(v)

        def flow(m: Mapping) -> str:
            return "{" + ", ".join(f"{k}: {s(v)}" for k, v in m.items()) + "}"

        dd, job = d["defaults"], d["job"]
        lines = [
            f"# Generated by `python docker/testcluster.py up --name {self.name}` for its container cluster.",
            f"# Try: clusterrun launch {self.inventory_path}",
            "version: 1",
            "defaults:",
        ]
        for k, v in dd.items():
            lines.append(f"  {k}: {flow(v) if isinstance(v, dict) else s(v)}")
        lines.append("hosts:")
        for h in d["hosts"]:
            # The address may look like a number to a careless reader, so quote nothing but check below.
            lines.append(f"  - {{name: {s(h['name'])}, host: {h['host']}}}")
        lines.append(f"master: {flow(d['master'])}")
        lines.append("job:")
        for k, v in job.items():
            if isinstance(v, list):
                lines.append(f"  {k}: [{', '.join(json.dumps(x) if k == 'args' else s(x) for x in v)}]")
            else:
                lines.append(f"  {k}: {s(v)}")
        text = "\n".join(lines) + "\n"
        try:
            import yaml  # the contract is the data, not the layout: make sure they agree
        except ImportError:
            return text
        if yaml.safe_load(text) != d:
            raise ClusterError(f"internal: the inventory text does not load back as written:\n{text}")
        return text

    def ssh_config(self) -> str:
        """For people: `ssh -F .cluster/NAME/ssh_config node1`."""
        out = [f"# Generated by docker/testcluster.py for cluster {self.name!r}."]
        for h in self.hosts:
            out += [f"Host {h.name} {h.address}", f"  HostName {h.address}", f"  User {USER}",
                    f"  IdentityFile {self.key_path}", "  IdentitiesOnly yes",
                    f"  UserKnownHostsFile {self.known_hosts_path}", "  StrictHostKeyChecking yes", ""]
        return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# CLI


def _cmd_up(a) -> int:
    c = Cluster(a.name, a.hosts, a.subnet, quiet=a.quiet)
    t0 = time.monotonic()
    c.up(timeout=a.timeout)
    t = c.timings
    print(f"cluster {c.name!r}: {len(c.hosts)} hosts ready in {time.monotonic() - t0:.1f} s (image "
          f"{t['image']:.1f} s, containers {t['compose']:.1f} s, first SSH logins {t['ssh']:.1f} s)",
          file=sys.stderr)
    for h in c.hosts:
        print(f"  {h.name}  {h.address}", file=sys.stderr)
    print(f"ssh:       ssh -F {c.ssh_config_path} node0", file=sys.stderr)
    print(f"down:      python {Path(__file__).resolve()} down --name {c.name}", file=sys.stderr)
    print(f"inventory: {c.inventory_path}", file=sys.stderr)
    print(c.inventory_path)  # stdout: just the path, for scripts
    return 0


def _cmd_down(a) -> int:
    Cluster(a.name).down()
    print(f"cluster {a.name!r} removed", file=sys.stderr)
    return 0


def _cmd_status(a) -> int:
    c = Cluster(a.name)
    rows = c.status()
    if a.json:
        print(json.dumps({"name": c.name, "subnet": str(c.subnet), "inventory": str(c.inventory_path),
                          "hosts": rows}, indent=2))
        return 0 if all(r["ssh"] for r in rows) else 1
    if not c.state_path.exists() and all(r["state"] == "missing" for r in rows):
        print(f"cluster {c.name!r} is not up", file=sys.stderr)
        return 1
    print(f"cluster {c.name!r} ({c.subnet}), inventory {c.inventory_path}")
    for r in rows:
        print(f"  {r['name']:<7} {r['address']:<15} {r['state']:<8} "
              f"{'net' if r['network'] else 'NO-NET'}  ssh {'ok' if r['ssh'] else 'FAILED'}")
    return 0 if all(r["ssh"] for r in rows) else 1


def _cmd_ssh(a) -> int:
    c = Cluster(a.name)
    argv = c.ssh_argv(a.host, " ".join(a.command))  # as ssh itself does: the remote shell splits it
    os.execvp(argv[0], argv)
    return 127


def _cmd_build(a) -> int:
    print(build_image(force=a.force, quiet=a.quiet))
    return 0


def _cmd_clean(a) -> int:
    for ref in remove_images(include_base=a.all):
        print(f"removed {ref}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="testcluster.py", description=__doc__.split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log every docker command")
    sub = p.add_subparsers(dest="cmd", required=True)

    def named(sp):
        sp.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
        return sp

    up = named(sub.add_parser("up", help="build (cached), start, wait for SSH, write the inventory"))
    up.add_argument("--hosts", type=int, default=DEFAULT_HOSTS, help=f"number of hosts (default {DEFAULT_HOSTS})")
    up.add_argument("--subnet", default=None, help=f"IPv4 /24 or larger (default {DEFAULT_SUBNET}, "
                                                    "or the cluster's current one)")
    up.add_argument("--timeout", type=float, default=120, help="seconds to wait for SSH logins")
    up.add_argument("-q", "--quiet", action="store_true", help="no build output")
    up.set_defaults(func=_cmd_up)
    named(sub.add_parser("down", help="remove containers, network and .cluster/NAME")).set_defaults(func=_cmd_down)
    st = named(sub.add_parser("status", help="state and SSH login of each host"))
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)
    ssh = named(sub.add_parser("ssh", help="log in to a host (or run a command) as cr"))
    ssh.add_argument("host")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    ssh.set_defaults(func=_cmd_ssh)
    b = sub.add_parser("build", help="build the image if its inputs changed; print its tag")
    b.add_argument("--force", action="store_true")
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=_cmd_build)
    cl = sub.add_parser("clean", help="remove clusterrun/host images")
    cl.add_argument("--all", action="store_true", help="the debootstrap base image too")
    cl.set_defaults(func=_cmd_clean)

    a = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    try:
        return a.func(a)
    except ClusterError as exc:
        print(f"testcluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
