"""The host's content cache: objects named by their SHA-256 (`cache/objects/ab/abcd…`, `-x` when executable),
and the index of what each looked like when stored (CacheIndex)."""

import os
import time

from ..wire import CHUNK, Fail


def safe_rel(path):
    parts = path.split("/")
    if not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise Fail("unsafe path in manifest: %r" % path, "protocol")
    return os.path.join(*parts)


def object_path(cache, sha, executable):
    return os.path.join(cache, sha[:2], sha + ("-x" if executable else ""))


def object_id(name):
    """(sha, executable) from an object's file name."""
    return (name[:-2], True) if name.endswith("-x") else (name, False)


class CacheIndex:
    """What each cached object looked like when it was last known good: `cache/objects.log`, one line per
    object stored or checked ("sha exec size mtime_ns ctime_ns"; the last line of an object wins),
    appended atomically.

    Run folders are hard links into the cache, so a job that writes to a pushed file (as root, or after a
    chmod) changes the cached object. Before an object is linked into a new run, it is compared with
    its line (size, mtime, ctime, read-only mode): a job can put size, mtime and mode back after a rewrite,
    never the ctime. When they differ, its SHA-256 decides: the same content is noted afresh, a changed
    one is dropped, fetched again, and the event logged in `cache/events.log`. Linking an object into a
    run folder (or a run folder's removal) changes its ctime too: whoever does so right after checking
    it notes it afresh (`renote`), so an unchanged job is not hashed again on the next push."""

    def __init__(self, cache):
        self.cache = cache
        self.path = os.path.join(cache, "objects.log")
        self.known = None
        self.pending = []  # lines of objects this push stored: written only once the push succeeded

    def _load(self):
        self.known = {}
        try:
            with open(self.path, "rb") as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) == 5:  # lines of an older version (no ctime) are not trusted: hashed again
                        self.known[(parts[0].decode(), parts[1] == b"1")] = tuple(int(p) for p in parts[2:])
        except (OSError, ValueError):
            pass

    def note(self, sha, exe, st, later=False):
        """Record what the object looks like now (later: once the push has succeeded, see flush)."""
        line = "%s %d %d %d %d\n" % (sha, 1 if exe else 0, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if later:
            self.pending.append(line)
        else:
            self._append(line)
        if self.known is not None:
            self.known[(sha, bool(exe))] = _look(st)

    def flush(self):
        if self.pending:
            self._append("".join(self.pending))
            self.pending = []

    def _append(self, text):
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def intact(self, sha, exe, st):
        """Whether the object still looks as it did when last known good (read-only, same size, times)."""
        if self.known is None:
            self._load()
        return not (st.st_mode & 0o222) and self.known.get((sha, bool(exe))) == _look(st)

    def check(self, sha, exe, size, path):
        """"ok" when the object at path holds its content, "missing", or "changed" (then it was removed,
        and the event logged)."""
        if self.known is None:
            self._load()
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "missing"
        readonly = not (st.st_mode & 0o222)
        if readonly and st.st_size == size and self.known.get((sha, bool(exe))) == _look(st):
            return "ok"
        if st.st_size == size and _sha256(path) == sha:
            self.note(sha, exe, st)  # the same content (touched, or stored by an older version): fine
            if not readonly:
                os.chmod(path, 0o555 if exe else 0o444)
            return "ok"
        self.event("object %s was changed after it was stored (a job writing to a pushed file?): dropped, "
                   "fetched again" % sha)
        try:
            os.unlink(path)
        except OSError:
            pass
        return "changed"

    def event(self, text):
        fd = os.open(os.path.join(self.cache, "events.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, ("%s %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), text)).encode())
        finally:
            os.close(fd)


def _look(st):
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sha256(path):
    import hashlib  # here: an unchanged push hashes nothing, and loading OpenSSL's costs 4 ms a host

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
