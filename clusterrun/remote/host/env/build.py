"""job.environment on this host: the venv at WORKDIR/envs/KEY, built once per key and used as it is by
every launch after (no installer run), then its stack fingerprint (fingerprint.py).

Protocol (framed JSON on the push's held channel, after the push's answer, before job.setup; held.py):
  controller → {"environment": {"key": hex, "base": executable, "requirements": path in the job folder,
                                "timeout": s, "installer": "auto" | "pip" | "uv",
                                "find_links": [paths in the job folder], "no_index": bool}}
  host       → {"env": {"step": "waiting" | "creating" | "installing" | "line", "text": ...}}*   progress
               {"beat": now}*                                   every 2 s while it works or waits
  host       → {"environment": {"python", "key", "built": bool, "waited": bool, "seconds", "installer",
                                "fingerprint": {...}}}
             or {"environment": {"error": text, "kind": "install" | "disk_full" | "timeout" | "base",
                                 "tail": [last lines of the installer], "log": path}}

Steps, each safe to be interrupted at any point:
  1. ready?  WORKDIR/envs/KEY/clusterrun-env.json exists: the venv is whole (it is written last, and the
     folder gets its name only after that): use it.
  2. lock    WORKDIR/envs/KEY.lock (flock): a second launch building the same key waits here, then finds
     it ready in step 1's check, made again under the lock.
  3. sweep   every WORKDIR/envs/.build-KEY-* left by a build that died (the lock says none is running).
  4. build   in WORKDIR/envs/.build-KEY-PID: `BASE -m venv` (or `uv venv`), then the installer with the
     requirements file, its output in RUN_DIR/environment.log; scripts' #! lines pointed at the final path.
  5. rename  to WORKDIR/envs/KEY: the one step that makes it visible. A failure at 4 removes the build
     folder; a kill leaves it for step 3 of the next build, or for `clean`.
"""

import errno
import fcntl
import os
import select
import shutil
import subprocess
import time

from ..stdlib import signal_names
from ..files import read_json, write_json_atomic
from ..procs import kill_group
from ..wire import send_msg
from . import fingerprint

BEAT_EVERY = 2.0
MARKER = "clusterrun-env.json"
BUILD_PREFIX = ".build-"
TAIL = 30


def envs_dir(workdir):
    return os.path.join(workdir, "envs")


def env_python(env_dir):
    return os.path.join(env_dir, "bin", "python")


def is_ready(env_dir):
    return os.path.isfile(os.path.join(env_dir, MARKER))


class BuildFailed(Exception):
    """Internal: a build step failed; its fields become the {"environment": {"error"}} answer."""

    def __init__(self, kind, message, tail=()):
        Exception.__init__(self, message)
        self.kind, self.tail = kind, list(tail)


def run_environment(workdir, run_dir, request, stdin):
    """Use or build the venv: the protocol's answer ({"environment": ...}) and whether it is ready (the
    caller sends the answer, a failure's after it removed the unstarted run)."""
    t0 = time.time()
    key = request["key"]
    final = os.path.join(envs_dir(workdir), key)
    log_path = os.path.join(run_dir, "environment.log")
    waited, built, installer = False, False, None
    try:
        if not is_ready(final):
            os.makedirs(envs_dir(workdir), 0o700, exist_ok=True)
            lock, waited = _lock(os.path.join(envs_dir(workdir), key + ".lock"), stdin)
            try:
                if not is_ready(final):
                    installer = _build(workdir, run_dir, request, final, log_path, stdin)
                    built = True
            finally:
                os.close(lock)
        info = read_json(os.path.join(final, MARKER)) or {}
        installer = installer or info.get("installer")
        _note_use(final, run_dir)
        found = fingerprint.of_env(final, env_python(final))
    except BuildFailed as exc:
        return {"environment": {"error": str(exc), "kind": exc.kind, "tail": exc.tail, "log": log_path}}, False
    return {"environment": {"python": env_python(final), "key": key, "built": built, "waited": waited,
                            "seconds": time.time() - t0, "installer": installer, "fingerprint": found}}, True


def _note_use(final, run_dir):
    """Which run used the venv last, and when (clean and retention keep an env a run used recently)."""
    os.utime(os.path.join(final, MARKER))
    write_json_atomic(os.path.join(run_dir, "environment.json"), {"env": os.path.basename(final),
                                                                  "used_at": time.time()})


def _lock(path, stdin):
    """The build lock of one key: taken at once, or waited for with beats (a second launch at once)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, waited
        except BlockingIOError:
            pass
        if not waited:
            send_msg({"env": {"step": "waiting", "text": "another launch is building this environment"}})
            waited = True
        ready, _, _ = select.select([stdin.fileno()], [], [], BEAT_EVERY)
        if ready and not os.read(stdin.fileno(), 1):
            os.close(fd)
            raise EOFError("the controller went away while waiting for the environment")
        send_msg({"beat": time.time()})


def sweep_builds(folder, key=None):
    """Remove the build folders a dead build left (all of them, or one key's): call with the lock held, or
    where no build can be running. The number removed."""
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if name.startswith(BUILD_PREFIX) and (key is None or name.startswith(BUILD_PREFIX + key + "-")):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            removed += 1
    return removed


def _build(workdir, run_dir, request, final, log_path, stdin):
    key = request["key"]
    folder = envs_dir(workdir)
    sweep_builds(folder, key)
    build = os.path.join(folder, "%s%s-%d" % (BUILD_PREFIX, key, os.getpid()))
    deadline = time.time() + float(request.get("timeout", 1800))
    installer = _installer(request.get("installer", "auto"))
    job = os.path.join(run_dir, "job")
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        send_msg({"env": {"step": "creating", "text": "%s venv with %s" % (installer, request["base"])}})
        _step(_venv_argv(installer, request["base"], build), job, log, stdin, deadline, "creating the venv")
        send_msg({"env": {"step": "installing", "text": installer}})
        _step(_install_argv(installer, build, request), job, log, stdin, deadline, "installing the requirements")
        _relocate(build, final)
        write_json_atomic(os.path.join(build, MARKER), {"key": key, "installer": installer, "base": request["base"],
                                                         "requirements": request["requirements"],
                                                         "built_at": time.time(), "run": os.path.basename(run_dir)})
        os.rename(build, final)
    except BaseException as exc:
        shutil.rmtree(build, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise BuildFailed("disk_full", "the disk filled while building the environment in %s; the build "
                              "folder was removed" % folder) from None
        raise
    finally:
        os.close(log)
    return installer


def _installer(wanted):
    """uv where it is installed (and asked for or left to us), else pip."""
    if wanted in ("auto", "uv") and shutil.which("uv"):
        return "uv"
    return "pip"


def _venv_argv(installer, base, build):
    if installer == "uv":
        return [shutil.which("uv"), "venv", "--quiet", "--python", base, build]
    return [base, "-m", "venv", build]


def _install_argv(installer, build, request):
    extra = []
    if request.get("no_index"):
        extra.append("--no-index")
    for place in request.get("find_links") or []:
        extra += ["--find-links", place]
    if installer == "uv":
        return [shutil.which("uv"), "pip", "install", "--python", env_python(build), "-r", request["requirements"]] \
            + extra
    return [env_python(build), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
            "--progress-bar", "off", "-r", request["requirements"]] + extra


def _step(argv, cwd, log, stdin, deadline, what):
    """One command of the build, its output to the log and, line by line, to the controller."""
    os.write(log, ("$ %s\n" % " ".join(argv)).encode())
    env = dict(os.environ, PIP_NO_INPUT="1", PYTHONUNBUFFERED="1")
    env.pop("VIRTUAL_ENV", None)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    except OSError as exc:
        raise BuildFailed("install", "%s: cannot run %s: %s" % (what, argv[0], exc)) from None
    tail = []
    try:
        _pump(proc, log, stdin, deadline, what, tail)
        code = proc.wait()
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            kill_group(proc)
    if code != 0:
        full = any("No space left on device" in line for line in tail)
        raise BuildFailed("disk_full" if full else "install", "%s: %s exited %s" % (
            what, os.path.basename(argv[0]), _exit_text(code)), tail)


def _pump(proc, log, stdin, deadline, what, tail):
    """The command's output to the log and the controller until it closes it; tail: its last lines."""
    out, pending = proc.stdout.fileno(), b""
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise BuildFailed("timeout", "%s: it took longer than timeouts.setup; the installer was killed"
                              % what, tail)
        ready, _, _ = select.select([out, stdin.fileno()], [], [], min(BEAT_EVERY, left))
        if stdin.fileno() in ready and not os.read(stdin.fileno(), 1):
            raise EOFError("the controller went away during the environment's build")
        if out not in ready:
            send_msg({"beat": time.time()})
            continue
        data = os.read(out, 1 << 16)
        if not data:
            if pending:
                tail[:] = (tail + [pending.decode("utf-8", "replace")])[-TAIL:]
            return
        os.write(log, data)
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace").rstrip()
            tail[:] = (tail + [text])[-TAIL:]
            if text.strip():
                send_msg({"env": {"step": "line", "text": text}})


def _exit_text(code):
    if code < 0:
        name = signal_names().get(-code)
        return "by signal %s" % name if name else "by signal %d" % -code
    return str(code)


def _relocate(build, final):
    """A venv names its own folder in its scripts' #! lines and activate files: point them at the final
    name before the rename (the interpreter itself finds its packages relative to where it is)."""
    old, new = build.encode(), final.encode()
    bin_dir = os.path.join(build, "bin")
    for name in os.listdir(bin_dir):
        path = os.path.join(bin_dir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as fh:
                data = fh.read(1 << 20)
        except OSError:
            continue
        if old in data and b"\x00" not in data:
            with open(path, "wb") as fh:
                fh.write(data.replace(old, new))
    cfg = os.path.join(build, "pyvenv.cfg")
    if os.path.isfile(cfg):
        with open(cfg, "rb") as fh:
            data = fh.read()
        if old in data:
            with open(cfg, "wb") as fh:
                fh.write(data.replace(old, new))
