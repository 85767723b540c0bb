"""`runs`: every run folder on this host with its status, its bytes and its log sizes; the cache's size;
the free space. A folder's status says whether it may go (see disk/clean.py).

A run folder may go only when nothing of it can run again here: it was started (spec.json) and in every
attempt folder the supervisor is gone and no rank process lives (pid + start time, or its process
marker); or it was never started and no push holds it (the receiving end keeps an exclusive lock on
RUN/.receiving for as long as its channel lives: pushing, running job.setup, waiting for the start).

Bytes: a file counts for a run when the run holds its only link (logs, outputs, checkpoints); the job's
files are the cache's (they are freed by the sweep once no run links them).
"""

import os
import shutil
import time

from ..files import read_json
from ..paths import attempt_dirs
from ..procs import MARKER_ENV, process_marker, same_process
from ..observe.pull import RunTree
from ..observe.state import collect_exits, load_state, supervisor_done
from ..wire import reply
from .lock import being_received


def cache_dir(workdir):
    return os.path.join(workdir, "cache", "objects")


def live_markers():
    """{process marker: pids} of this user's processes that carry one: read from /proc once per command
    (a rank that left its process group, or outlived its supervisor, still carries its run's marker)."""
    found = {}
    prefix = ("%s=" % MARKER_ENV).encode()
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit() and int(n) != os.getpid()]
    except OSError:
        return found
    for name in names:
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(prefix):
                found.setdefault(item[len(prefix):].decode("utf-8", "replace"), []).append(int(name))
    return found


def _live(folder, markers):
    """Why something of this (attempt) folder may still run, or ""."""
    spec, state = load_state(folder, must_exist=False)
    if spec is None:
        return ""
    sup = (state or {}).get("supervisor", {})
    if same_process(sup.get("pid"), sup.get("ticks")):
        return "its supervisor runs"
    if state is None and time.time() - _mtime(os.path.join(folder, "spec.json")) < 30:
        return "it is starting"
    still = _process_left(state)
    if still:
        return still
    if markers.get(process_marker(spec)):
        return "a process of it still runs (pid %d)" % markers[process_marker(spec)][0]
    if state is not None and not supervisor_done(folder):  # its supervisor died: finish what it left undone
        collect_exits(folder, spec, state)
    return ""


def _process_left(state):
    """Which recorded process of the run still runs ("" when none does)."""
    for name, info in list(((state or {}).get("ranks") or {}).items()) + [("torchrun", (state or {}).get("launcher"))]:
        if info and same_process(info.get("pid"), info.get("ticks")):
            return "rank %s still runs" % name if name != "torchrun" else "its torchrun still runs"
    return ""


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def status(run_dir, markers=None):
    """("running" | "finished" | "receiving" | "unstarted", why); markers: live_markers(), if at hand."""
    folders = [run_dir] + attempt_dirs(run_dir)
    markers = live_markers() if markers is None else markers
    for folder in folders:
        why = _live(folder, markers)
        if why:
            return "running", (why + (" (%s)" % os.path.basename(folder) if folder != run_dir else ""))
    if any(os.path.exists(os.path.join(f, "spec.json")) for f in folders):
        return "finished", ""
    if being_received(run_dir):
        return "receiving", "a push or its setup holds it"
    return "unstarted", "pushed but never started"


def walk(folder):
    """(bytes only this folder links, bytes of files linked elsewhere too (the job), {inode: links here})."""
    own = shared = 0
    links = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_nlink > 1:
                links[(st.st_dev, st.st_ino)] = links.get((st.st_dev, st.st_ino), 0) + 1
                shared += st.st_size
            else:
                own += st.st_size
    return own, shared, links


def _logs(run_dir):
    """{attempt: {rank: log size}} (rank-R.log in the run folder and in each attempt folder)."""
    out = {}
    for k, folder in enumerate([run_dir] + attempt_dirs(run_dir)):
        attempt = 0 if k == 0 else int(os.path.basename(folder).split("-")[1])
        sizes = {}
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        for name in names:
            if name.startswith("rank-") and name.endswith(".log") and name[5:-4].isdigit():
                sizes[name[5:-4]] = os.path.getsize(os.path.join(folder, name))
        out[str(attempt)] = sizes
    return out


def _ended_at(run_dir):
    """When the run last did anything here: the newest mtime of its top-level files and attempt folders."""
    newest = _mtime(run_dir)
    for folder in [run_dir] + attempt_dirs(run_dir):
        try:
            for entry in os.scandir(folder):
                if entry.is_file(follow_symlinks=False):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
        except OSError:
            pass
    return newest


def cache_usage(workdir):
    """(objects, bytes, objects in no run folder, their bytes)."""
    n = size = free_n = free_size = 0
    for _path, st in cache_objects(cache_dir(workdir)):
        n += 1
        size += st.st_size
        if st.st_nlink == 1:
            free_n += 1
            free_size += st.st_size
    return n, size, free_n, free_size


def cache_objects(cache):
    try:
        subdirs = [e for e in os.scandir(cache) if e.is_dir(follow_symlinks=False) and len(e.name) == 2]
    except OSError:
        return
    for sub in subdirs:
        try:
            entries = list(os.scandir(sub.path))
        except OSError:
            continue
        for e in entries:
            if ".tmp-" in e.name or not e.is_file(follow_symlinks=False):
                continue
            try:
                yield e.path, e.stat(follow_symlinks=False)
            except OSError:
                continue


def disk(workdir):
    usage = shutil.disk_usage(workdir)
    return {"free": usage.free, "total": usage.total}


def _selects_any(run_dir, patterns):
    """Whether the run's job.outputs select any file (the listing a pull would make, without its hashes)."""
    tree = RunTree(run_dir)
    try:
        return any(True for text in patterns if isinstance(text, str)
                   for _ in tree.matches(*tree.place(text)))
    except Exception:  # a pattern the pull would refuse: say "maybe", so the run is kept
        return True


def cmd_runs(workdir):
    """Every run folder here with its status, its bytes and its log sizes; the cache's size; free space."""
    runs_dir = os.path.join(workdir, "runs")
    runs = []
    total_own = 0
    markers = live_markers()
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        run_dir = os.path.join(runs_dir, name)
        if not os.path.isdir(run_dir) or name.startswith("."):
            continue
        state, why = status(run_dir, markers)
        own, shared, _ = walk(run_dir)
        total_own += own
        spec = read_json(os.path.join(run_dir, "spec.json")) or {}
        entry = {"id": name, "status": state, "why": why, "bytes": own, "job_bytes": shared,
                 "ended_at": _ended_at(run_dir), "logs": _logs(run_dir),
                 "secrets_left": any(n in (r.get("env") or {}) for r in spec.get("ranks", [])
                                     for n in spec.get("secret_names") or [])}
        if state == "finished" and spec.get("outputs"):  # anything there to keep for a pull? (clean's policy)
            entry["outputs_found"] = _selects_any(run_dir, spec["outputs"])
        runs.append(entry)
    n, size, free_n, free_size = cache_usage(workdir)
    from ..env.usage import listing

    envs = listing(workdir)
    reply({"runs": runs, "envs": envs,
           "usage": dict(disk(workdir), runs=total_own, cache=size, cache_objects=n, cache_unreferenced=free_size,
                         cache_unreferenced_objects=free_n, envs=sum(e["bytes"] for e in envs), envs_count=len(envs)),
           "now": time.time()})
    return 0
