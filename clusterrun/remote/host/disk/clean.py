"""`clean`: remove the run folders the controller names (each re-checked here at the moment of removal,
so a run that started since it was listed is refused, never removed), then collect the content cache.

The cache: run folders are hard links into cache/objects, so an object whose link count is 1 is in no
run folder (mark by the file system itself). The sweep holds cache/lock exclusively; a push holds it
shared from the moment it decides which objects the cache has until each is linked into its run folder,
so a push and a sweep at once never lose an object the push counted on. objects.log (the cache index)
is rewritten without the swept objects under the same lock.
"""

import os
import shutil
import sys

from ..stdlib import json
from .cache import CacheIndex, object_id
from ..wire import reply
from .lock import LOCK_WAIT, cache_lock, run_lock
from .runs import cache_dir, cache_objects, cache_usage, disk, live_markers, status, walk


def cmd_clean(workdir):
    """Remove the run folders named on stdin ({"remove": [ids], "cache": bool, "cache_max": bytes or null,
    "envs_max_age": seconds or null, "dry_run": bool}) that may go, then collect the cache and the venvs
    no live run uses (env/usage.py; all of them with "cache"); say what was (or would be) freed."""
    request = json.loads(sys.stdin.buffer.read().decode() or "{}")
    dry = bool(request.get("dry_run"))
    runs_dir = os.path.join(workdir, "runs")
    removed, refused, gone_links = [], [], {}
    if not dry:
        finish_removals(runs_dir)
    markers = live_markers()
    renote = _Renote(workdir)
    for run_id in request.get("remove") or []:
        gone = _remove_one(runs_dir, run_id, dry, markers, renote)
        if "why" in gone:
            refused.append(gone)
            continue
        for key, count in gone.pop("links").items():
            gone_links[key] = gone_links.get(key, 0) + count
        removed.append(gone)
    renote.after()
    cache = None
    if request.get("cache") or request.get("cache_max") is not None:
        cache = sweep(workdir, dry, gone_links, request.get("cache_max"), request.get("wait", LOCK_WAIT),
                      everything=bool(request.get("cache")))
    envs = None
    if request.get("envs_max_age") is not None or request.get("cache"):
        from ..env.usage import collect

        envs = collect(workdir, lambda run_dir: status(run_dir, markers)[0] not in ("finished", "unstarted"),
                       request.get("envs_max_age"), bool(request.get("cache")), dry)
    n, size, _, _ = cache_usage(workdir)
    reply({"removed": removed, "refused": refused, "cache": cache, "envs": envs, "dry_run": dry,
           "usage": dict(disk(workdir), cache=size, cache_objects=n)})
    return 0


def _remove_one(runs_dir, run_id, dry, markers, renote):
    """{id, bytes, links} of a run folder removed (or, dry, that would be), or {id, why} of one refused:
    checked under its lock, so an attempt starting at this moment is refused here or never starts."""
    run_dir = os.path.normpath(os.path.join(runs_dir, run_id))
    if os.path.dirname(run_dir) != runs_dir or run_id.startswith("."):
        return {"id": run_id, "why": "not a run id"}
    if not os.path.isdir(run_dir):
        return {"id": run_id, "why": "no such run here", "missing": True}
    lock = run_lock(run_dir, wait=0)
    if lock is None:
        return {"id": run_id, "why": "an attempt of it is being started"}
    try:
        state, why = status(run_dir, markers)
        if state not in ("finished", "unstarted"):
            return {"id": run_id, "why": why or state}
        own, _, links = walk(run_dir)
        if not dry:
            renote.before(links)
            try:
                _remove(run_dir)
            except OSError as exc:  # one folder that resists never costs the others their clean
                return {"id": run_id, "why": "cannot remove it: %s" % (exc.strerror or exc)}
        return {"id": run_id, "bytes": own, "links": links}
    finally:
        os.close(lock)


class _Renote:
    """Unlinking a run folder's job files changes their cache objects' ctime: the objects that were intact
    just before (their index line still held) are noted afresh after, so the next push trusts them."""

    def __init__(self, workdir):
        self.cache = cache_dir(workdir)
        self.index = CacheIndex(self.cache)
        self.by_inode = None
        self.intact = {}  # (dev, ino) -> (sha, exe, path)

    def before(self, links):
        if self.by_inode is None:
            self.by_inode = {(st.st_dev, st.st_ino): (path, st) for path, st in cache_objects(self.cache)}
        for key in links:
            found = self.by_inode.get(key)
            if found is not None:
                sha, exe = object_id(os.path.basename(found[0]))
                if self.index.intact(sha, exe, found[1]):
                    self.intact[key] = (sha, exe, found[0])

    def after(self):
        for sha, exe, path in self.intact.values():
            try:
                self.index.note(sha, exe, os.stat(path))
            except OSError:
                continue


REMOVING = ".removing-"


def _remove(run_dir):
    """Gone at once for every reader (renamed aside first), then deleted; read-only job files included."""
    aside = os.path.join(os.path.dirname(run_dir), "%s%s-%d" % (REMOVING, os.path.basename(run_dir), os.getpid()))
    os.rename(run_dir, aside)
    remove_tree(aside)


def remove_tree(path):
    """Delete a folder whatever the job left in it: a folder it made unreadable or unwritable is given
    back its mode (it is ours) and tried again, to any depth; what still cannot go stays for the next
    clean (finish_removals)."""
    shutil.rmtree(path, onerror=_fix_and_retry)


def _fix_and_retry(func, target, exc_info):
    for folder in (os.path.dirname(target), target):
        try:
            if os.path.isdir(folder) and not os.path.islink(folder):
                os.chmod(folder, 0o700)
        except OSError:
            pass
    try:
        if func in (os.rmdir, os.unlink, os.remove):
            func(target)
        elif os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target, onerror=_fix_and_retry)  # it could not even be opened: now it can
        else:
            os.unlink(target)
    except OSError:
        pass


def finish_removals(runs_dir):
    """Folders an earlier clean renamed aside but could not delete (it was killed, or a file resisted)."""
    try:
        names = os.listdir(runs_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(REMOVING):
            remove_tree(os.path.join(runs_dir, name))


def sweep(workdir, dry, gone_links, cache_max, wait, everything):
    """Remove objects no run folder links (everything: all of them; else oldest first until the cache is
    under cache_max bytes). dry: count only, as if the runs about to go were gone (gone_links)."""
    lock = None if dry else cache_lock(workdir, exclusive=True, wait=wait)
    if lock is None and not dry:
        return {"busy": True, "removed": 0, "bytes": 0}
    try:
        if not dry:
            _drop_partial_objects(cache_dir(workdir))
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


def _drop_partial_objects(cache):
    """Objects half-written by a push that was killed mid-object (`SHA.tmp-PID`): under the sweep's
    exclusive lock no push is writing, so every one of them is left over."""
    try:
        subdirs = [e.path for e in os.scandir(cache) if e.is_dir(follow_symlinks=False) and len(e.name) == 2]
    except OSError:
        return
    for sub in subdirs:
        try:
            names = [n for n in os.listdir(sub) if ".tmp-" in n]
        except OSError:
            continue
        for name in names:
            try:
                os.unlink(os.path.join(sub, name))
            except OSError:
                pass


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
                if len(parts) == 5:
                    last[(parts[0], parts[1])] = line
    except OSError:
        return
    keep = [line for (sha, exe), line in last.items()
            if os.path.exists(os.path.join(cache, sha[:2].decode(), sha.decode() + ("-x" if exe == b"1" else "")))]
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "wb") as fh:
        fh.writelines(keep)
    os.replace(tmp, path)
