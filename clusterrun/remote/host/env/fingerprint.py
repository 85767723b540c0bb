"""The stack fingerprint of an interpreter: what must be the same on every host of a run (Python, torch,
torch.version.cuda, NCCL, cuDNN) and the GPU driver.

Read without importing torch (which takes seconds, 16 s on a loaded box here): torch's own
`torch/version.py` (its __version__ and cuda, as `torch.version` has them; a package without one: the
__version__ line of its __init__.py), found with importlib's finder, which runs none of its code; NCCL and
cuDNN as the wheels torch depends on have them (nvidia-nccl-cu12, nvidia-cudnn-cu12: what torch loads).
Still cached: inside a venv of ours (WORKDIR/envs/KEY/fingerprint.json; the key decides its content),
or for a plain interpreter in WORKDIR/fingerprints/, keyed by it and the state (mtimes) of its
site-packages folders, so installing a package there reads it anew. The driver is the host's, not the
interpreter's: read each time (/proc/driver/nvidia/version, else `nvidia-smi`, else none).

The record: {"python", "torch", "cuda", "nccl", "cudnn", "driver"}: each a version string or null
(no torch, a CPU build, no GPU), and "error" where the interpreter could not say (its last line).
"""

import os
import sys
import zlib

from ..stdlib import json
from ..files import read_json, write_json_atomic
from ..shell import which

# run by `python -c`: sets `found`
PROBE = r"""
import importlib.util, os, platform, re
try:
    from importlib import metadata
except ImportError:
    metadata = None

def _dist(*names):
    for name in names:
        try:
            return metadata.version(name) if metadata else None
        except Exception:
            continue
    return None

def _assigned(path, name):
    try:
        with open(path) as fh:
            text = fh.read(1 << 16)
    except OSError:
        return None
    m = re.search(r"^%s\s*(?::\s*[^=]+)?=\s*[\x27\x22]([^\x27\x22]*)[\x27\x22]" % name, text, re.M)
    return m.group(1) if m else None

found = {"python": platform.python_version(), "torch": None, "cuda": None, "nccl": None, "cudnn": None}
try:
    spec = importlib.util.find_spec("torch")
except (ImportError, ValueError):
    spec = None
if spec is not None and spec.origin:
    folder = os.path.dirname(spec.origin)
    version_py = os.path.join(folder, "version.py")
    found["torch"] = _assigned(version_py, "__version__") or _assigned(spec.origin, "__version__")
    found["cuda"] = _assigned(version_py, "cuda")
    found["nccl"] = _dist("nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl-cu13")
    found["cudnn"] = _dist("nvidia-cudnn-cu12", "nvidia-cudnn-cu11", "nvidia-cudnn-cu13")
"""
EMPTY = {"python": None, "torch": None, "cuda": None, "nccl": None, "cudnn": None}
MODULE = "Kernel Module"  # /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05 ..."
TIMEOUT = 60.0


def probe(python):
    """The Python side of the fingerprint of an interpreter: one short subprocess with its site-packages
    (the host program itself runs with -S, without them)."""
    import subprocess  # here: a relaunch reads the cache and starts no process

    code = PROBE + "\nimport json\nprint(json.dumps(found))\n"
    try:
        done = subprocess.run([python, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=TIMEOUT)
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise OSError("%s exited %d: %s" % (python, done.returncode, tail[-1] if tail else "no output"))
        return json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        return dict(EMPTY, error=str(exc))


def driver(proc_file="/proc/driver/nvidia/version", smi=None):
    """The NVIDIA driver's version, or None on a host without one."""
    try:
        with open(proc_file) as fh:
            text = fh.read()
        words = text[text.find(MODULE) + len(MODULE):].split() if MODULE in text else []
        if words and is_version(words[0]):
            return words[0]
    except OSError:
        pass
    smi = smi or which("nvidia-smi")
    if not smi:
        return None
    import subprocess

    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.decode("utf-8", "replace").split()
    # "[N/A]" or an error text is no version: unknown, as on a host without a driver
    return lines[0] if done.returncode == 0 and lines and is_version(lines[0]) else None


def is_version(word):
    """`535.104.05`: numbers and dots, two numbers at least (no regex: re is not loaded on the push's path,
    stdlib.py)."""
    parts = word.split(".")
    return len(parts) >= 2 and all(p.isascii() and p.isdigit() for p in parts)


def of_env(env_dir, python):
    """A venv of ours: cached inside it (the key decides what is installed there)."""
    return _cached(os.path.join(env_dir, "fingerprint.json"), lambda: probe(python))


def of_interpreter(workdir):
    """This interpreter (a plain `python:`): cached under WORKDIR/fingerprints, keyed by it and the state
    of its site-packages folders (a package installed there changes a folder's mtime)."""
    import site  # (the host program runs with -S: the module is not loaded, nor its paths added)

    places = [sys.executable] + list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    state = []
    for place in places:
        try:
            state.append([place, os.stat(place).st_mtime_ns])
        except OSError:
            state.append([place, None])
    text = json.dumps(state).encode()  # a cache key, not a secret: two checksums, not hashlib's OpenSSL load
    key = "%08x%08x" % (zlib.crc32(text), zlib.adler32(text))
    return _cached(os.path.join(workdir, "fingerprints", key + ".json"), lambda: probe(sys.executable))


def _cached(path, compute):
    found = read_json(path)
    if found is None or "error" in found:
        found = compute()
        if "error" not in found:
            os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
            write_json_atomic(path, found)
        found = dict(found, cached=False)
    else:
        found = dict(found, cached=True)
    found["driver"] = driver()
    return found
