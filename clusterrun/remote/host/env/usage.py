"""The venvs of WORKDIR/envs as `runs` lists them and `clean` collects them: each venv's size and when a
run last used it (its marker's mtime: build.py touches it at every use); a venv is in use while a run
that used it is not finished (RUN/environment.json names it), and `clean` never removes such a one. A
build folder whose key's lock nobody holds is a dead build: it goes whenever `clean` runs.
"""

import os
import shutil
import time

from ..disk.lock import held
from ..files import read_json
from .build import BUILD_PREFIX, MARKER, envs_dir


def _size(folder):
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                continue
    return total


def listing(workdir):
    """[{key, bytes, last_used}] of the finished venvs here."""
    out = []
    folder = envs_dir(workdir)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        try:
            used = os.stat(os.path.join(path, MARKER)).st_mtime
        except OSError:
            continue  # a build folder, a lock, or a venv being removed
        out.append({"key": name, "bytes": _size(path), "last_used": used})
    return out


def in_use(workdir, live):
    """The keys of venvs a live run uses (live: run_dir → whether it is not finished)."""
    runs = os.path.join(workdir, "runs")
    keys = set()
    for name in os.listdir(runs) if os.path.isdir(runs) else []:
        run_dir = os.path.join(runs, name)
        used = read_json(os.path.join(run_dir, "environment.json"))
        if used and live(run_dir):
            keys.add(used.get("env"))
    return keys


def _building(folder, key):
    """Whether a build of this key holds its lock now."""
    return held(os.path.join(folder, key + ".lock"))


def _remove(folder, env):
    """Gone for every reader at once (renamed aside), then deleted; False when it could not be moved."""
    aside = os.path.join(folder, "%sremoving-%s-%d" % (BUILD_PREFIX, env["key"], os.getpid()))
    try:
        os.rename(os.path.join(folder, env["key"]), aside)
    except OSError:
        return False
    shutil.rmtree(aside, ignore_errors=True)
    return True


def _dead_builds(folder):
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        key = name[len(BUILD_PREFIX):].split("-")[0]
        if name.startswith(BUILD_PREFIX) and not _building(folder, key):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def collect(workdir, live, max_age, everything, dry):
    """Remove the venvs no live run uses that no run used for max_age seconds (every unused one with
    everything), and the dead builds; {removed: [{key, bytes}], kept_in_use: [keys], bytes}."""
    folder = envs_dir(workdir)
    busy = in_use(workdir, live)
    now = time.time()
    removed = []
    for env in listing(workdir):
        old = everything or (max_age is not None and now - env["last_used"] > max_age)
        if old and env["key"] not in busy and not _building(folder, env["key"]) and (dry or _remove(folder, env)):
            removed.append({"key": env["key"], "bytes": env["bytes"]})
    if not dry:
        _dead_builds(folder)
    return {"removed": removed, "in_use": sorted(k for k in busy if k), "bytes": sum(r["bytes"] for r in removed)}
