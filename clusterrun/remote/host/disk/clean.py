"""`clean`: remove the run folders the controller names (each re-checked here at the moment of removal,
so a run that started since it was listed is refused, never removed), then collect the content cache.

The cache: run folders are hard links into cache/objects, so an object whose link count is 1 is in no
run folder (mark by the file system itself). The sweep holds cache/lock exclusively; a push holds it
shared from the moment it decides which objects the cache has until each is linked into its run folder,
so a push and a sweep at once never lose an object the push counted on. objects.log (the cache index)
is rewritten without the swept objects under the same lock.
"""

import json
import os
import shutil
import sys

from ..wire import reply
from .lock import LOCK_WAIT, cache_lock
from .runs import cache_dir, cache_objects, cache_usage, disk, live_markers, status, walk


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
        own, _, links = walk(run_dir)
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
        objects = list(cache_objects(cache_dir(workdir)))
        total = sum(st.st_size for _, st in objects)
        removed = freed = 0
        for _, path, st in _loose(objects, gone_links):
            if not everything and (cache_max is None or total - freed <= cache_max):
                break
            if not dry and not _unlink_loose(path):
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


def _loose(objects, gone_links):
    """The objects no run folder links (once the runs about to go are gone), oldest first."""
    loose = [(st.st_mtime, path, st) for path, st in objects
             if st.st_nlink - gone_links.get((st.st_dev, st.st_ino), 0) <= 1]
    loose.sort()
    return loose


def _unlink_loose(path):
    """Remove a loose object; False where it is linked again or gone."""
    try:
        if os.lstat(path).st_nlink > 1:  # linked since we looked (cannot happen under the lock)
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


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
