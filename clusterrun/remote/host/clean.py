"""Disk on this host: what each run folder holds and whether it may go (`runs`), and removing the ones the
controller names, then collecting the content cache (`clean`).

A run folder may go only when nothing of it can run again here: it was started (spec.json) and in every
attempt folder the supervisor is gone and no rank process lives (pid + start time, or its process
marker); or it was never started and no push holds it (the receiving end keeps an exclusive lock on
RUN/.receiving for as long as its channel lives: pushing, running job.setup, waiting for the start).
The controller adds what only it knows (a restart may follow); this end re-checks at the moment of
removal, so a run that started meanwhile is refused, never removed.

The cache: run folders are hard links into cache/objects, so an object whose link count is 1 is in no
run folder (mark by the file system itself). The sweep holds cache/lock exclusively; a push holds it
shared from the moment it decides which objects the cache has until each is linked into its run folder,
so a push and a sweep at once never lose an object the push counted on. objects.log (the cache index)
is rewritten without the swept objects under the same lock.

Bytes: a file counts for a run when the run holds its only link (logs, outputs, checkpoints); the job's
files are the cache's (they are freed by the sweep once no run links them).
"""

import fcntl
import json
import os
import shutil
import sys
import time

from .common import attempt_dirs, read_json, reply
from .procs import MARKER_ENV, process_marker, same_process
from .runstate import load_state

LOCK_WAIT = 60.0  # how long a sweep waits for pushes in flight to finish with the cache


def cache_dir(workdir):
    return os.path.join(workdir, "cache", "objects")


def cache_lock(workdir, exclusive, wait):
    """An open lock file on the cache, held (shared by pushes, exclusive by a sweep); None when the wait
    ran out. Closing the file releases it."""
    folder = os.path.join(workdir, "cache")
    os.makedirs(folder, 0o700, exist_ok=True)
    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.02)


def hold_receiving(run_dir):
    """The receiving end's mark on a run folder it is making: an exclusive lock kept until it exits."""
    fd = os.open(os.path.join(run_dir, ".receiving"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _being_received(run_dir):
    try:
        fd = os.open(os.path.join(run_dir, ".receiving"), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


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
    for name, info in list(((state or {}).get("ranks") or {}).items()) + [("torchrun", (state or {}).get("launcher"))]:
        if info and same_process(info.get("pid"), info.get("ticks")):
            return "rank %s still runs" % name if name != "torchrun" else "its torchrun still runs"
    if markers.get(process_marker(spec)):
        return "a process of it still runs (pid %d)" % markers[process_marker(spec)][0]
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
    if _being_received(run_dir):
        return "receiving", "a push or its setup holds it"
    return "unstarted", "pushed but never started"


def _walk(folder):
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
    for _path, st in _objects(cache_dir(workdir)):
        n += 1
        size += st.st_size
        if st.st_nlink == 1:
            free_n += 1
            free_size += st.st_size
    return n, size, free_n, free_size


def _objects(cache):
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
        own, shared, _ = _walk(run_dir)
        total_own += own
        spec = read_json(os.path.join(run_dir, "spec.json")) or {}
        runs.append({"id": name, "status": state, "why": why, "bytes": own, "job_bytes": shared,
                     "ended_at": _ended_at(run_dir), "logs": _logs(run_dir),
                     "secrets_left": any(n in (r.get("env") or {}) for r in spec.get("ranks", [])
                                         for n in spec.get("secret_names") or [])})
    n, size, free_n, free_size = cache_usage(workdir)
    reply({"runs": runs, "usage": dict(disk(workdir), runs=total_own, cache=size, cache_objects=n,
                                       cache_unreferenced=free_size, cache_unreferenced_objects=free_n),
           "now": time.time()})
    return 0


def cmd_clean(workdir):
    """Remove the run folders named on stdin ({"remove": [ids], "cache": bool, "cache_max": bytes or null,
    "dry_run": bool}) that may go, then collect the cache; say what was (or would be) freed."""
    request = json.loads(sys.stdin.buffer.read().decode() or "{}")
    dry = bool(request.get("dry_run"))
    runs_dir = os.path.join(workdir, "runs")
    removed, refused, gone_links = [], [], {}
    markers = live_markers()
    for run_id in request.get("remove") or []:
        run_dir = os.path.normpath(os.path.join(runs_dir, run_id))
        if os.path.dirname(run_dir) != runs_dir or run_id.startswith("."):
            refused.append({"id": run_id, "why": "not a run id"})
            continue
        if not os.path.isdir(run_dir):
            refused.append({"id": run_id, "why": "no such run here", "missing": True})
            continue
        state, why = status(run_dir, markers)
        if state not in ("finished", "unstarted"):
            refused.append({"id": run_id, "why": why or state})
            continue
        own, _, links = _walk(run_dir)
        for key, count in links.items():
            gone_links[key] = gone_links.get(key, 0) + count
        if not dry:
            _remove(run_dir)
        removed.append({"id": run_id, "bytes": own})
    cache = None
    if request.get("cache") or request.get("cache_max") is not None:
        cache = sweep(workdir, dry, gone_links, request.get("cache_max"), request.get("wait", LOCK_WAIT),
                      everything=bool(request.get("cache")))
    n, size, _, _ = cache_usage(workdir)
    reply({"removed": removed, "refused": refused, "cache": cache, "dry_run": dry,
           "usage": dict(disk(workdir), cache=size, cache_objects=n)})
    return 0


def _remove(run_dir):
    """Gone at once for every reader (renamed aside first), then deleted; read-only job files included."""
    aside = os.path.join(os.path.dirname(run_dir), ".removing-%s-%d" % (os.path.basename(run_dir), os.getpid()))
    os.rename(run_dir, aside)

    def writable(func, path, exc_info):
        os.chmod(os.path.dirname(path), 0o700)
        func(path)

    shutil.rmtree(aside, onerror=writable)


def sweep(workdir, dry, gone_links, cache_max, wait, everything):
    """Remove objects no run folder links (everything: all of them; else oldest first until the cache is
    under cache_max bytes). dry: count only, as if the runs about to go were gone (gone_links)."""
    lock = None if dry else cache_lock(workdir, exclusive=True, wait=wait)
    if lock is None and not dry:
        return {"busy": True, "removed": 0, "bytes": 0}
    try:
        objects = list(_objects(cache_dir(workdir)))
        total = sum(st.st_size for _, st in objects)
        loose = [(st.st_mtime, path, st) for path, st in objects
                 if st.st_nlink - gone_links.get((st.st_dev, st.st_ino), 0) <= 1]
        loose.sort()
        removed = freed = 0
        for _, path, st in loose:
            if not everything and (cache_max is None or total - freed <= cache_max):
                break
            if not dry:
                try:
                    if os.lstat(path).st_nlink > 1:  # linked since we looked (cannot happen under the lock)
                        continue
                    os.unlink(path)
                except OSError:
                    continue
            removed += 1
            freed += st.st_size
        if removed and not dry:
            _compact_index(cache_dir(workdir))
        return {"busy": False, "removed": removed, "bytes": freed, "kept": len(objects) - removed,
                "kept_bytes": total - freed}
    finally:
        if lock is not None:
            os.close(lock)


def _compact_index(cache):
    """objects.log without the lines of objects no longer there (the last line of each object kept)."""
    path = os.path.join(cache, "objects.log")
    last = {}
    try:
        with open(path, "rb") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 4:
                    last[(parts[0], parts[1])] = line
    except OSError:
        return
    keep = [line for (sha, exe), line in last.items()
            if os.path.exists(os.path.join(cache, sha[:2].decode(), sha.decode() + ("-x" if exe == b"1" else "")))]
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "wb") as fh:
        fh.writelines(keep)
    os.replace(tmp, path)
