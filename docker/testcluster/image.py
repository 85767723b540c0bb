"""The host image: a Debian base (a registry's, or made with debootstrap), a wheelhouse fetched here
(containers may have no HTTPS), and a cached build keyed by a hash of its inputs."""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import (CLUSTER_ROOT, DOCKER_DIR, IMAGE_REPO, LABEL, LOCAL_BASE_IMAGE, REGISTRY_BASE_IMAGE,
                     TORCH_CPU_INDEX, WHEEL_PYTHON, ClusterError, log)
from .dockercli import _build_argv, _run, docker, docker_bin, image_id

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
        raise ClusterError("debootstrap needs root: run `sudo python docker/testcluster build` once "
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
