"""`pull`: files of a run's folder back to the controller: listed with size, mode and SHA-256, then the
bytes the controller asks for, each from an offset (a pull that was cut resumes where it stopped).

Protocol (framed JSON messages, wire.read_msg/send_msg; file bytes in length-prefixed chunks):
  controller → {"paths": [PATH...]}
  host       → {"files": [[rel, size, mode, sha256 or null]...], "unmatched": [PATH...],
                "skipped": [[rel, why]...]}   or {error, kind, path} (kind "outside": a PATH out of the run)
               (the SHA-256 only where this host remembers it: hashing every file before sending any
               would read each twice)
  controller → {"want": [[rel, offset, prefix, have]...]}
               offset, prefix: the controller holds the file's first `offset` bytes, whose SHA-256 is
               prefix (a pull that was cut); have: the SHA-256 of the whole file the controller holds at
               the listed size (or null)
  host       → for each file wanted, in order: {"file": rel, "same": true} when its SHA-256 is `have`;
               else {"file": rel, "offset": o} (o is 0 when the controller's bytes are not a prefix of
               the file: it starts over), then chunks (4-byte length, bytes; a length of 0 ends the
               file), then {"sha256": of the whole file as the controller now has it, "size": its length}
  host       → {"done": true}

PATH: relative to the run's job folder (where the ranks ran): a file, a folder (everything under it), or
a glob (`*`, `?`, `[...]` within one name; `**` any number of folders; a folder it matches brings
everything under it). `checkpoints/...` is in the run's checkpoint folder (CLUSTERRUN_CHECKPOINT_DIR:
RUN/checkpoints, or job.checkpoint_dir); `./checkpoints/...` a folder of that name in the job folder. An
absolute PATH is taken relative to whichever of the two it lies in; anything else, and any `..`, is
refused. Symlinks are followed only when they resolve inside the run's folder or its checkpoint folder;
folders behind symlinks are not walked (both are listed as skipped). The files are read as they are when
asked: a running run's are a snapshot, each file cut at the size the listing gave.

Hashes (made while a file is sent, or to compare it with the controller's) are remembered in
WORKDIR/cache/pull-sums.json by path, size, mtime, ctime and inode, so an unchanged checkpoint is not
read again to be listed or compared.
"""

import fnmatch
import hashlib
import os
import stat
import struct
import sys

from ..stdlib import json
from ..files import read_json
from ..paths import job_dir, run_root
from ..wire import CHUNK, Fail, read_msg, send_msg

SUMS = "pull-sums.json"
MAX_SUMS = 20000  # remembered hashes kept per host (the oldest go first)
GLOB_CHARS = "*?["
CHUNK_LEN = struct.Struct(">I")


def cmd_pull(workdir, run_dir):
    root = run_root(run_dir)
    if not os.path.isdir(root):
        raise Fail("the run's folder is not on this host (removed by `clusterrun clean`?)", "missing", root)
    request = read_msg(sys.stdin.buffer)
    sums = Sums(os.path.join(workdir, "cache", SUMS))
    tree = RunTree(root)
    listing = tree.select(request.get("paths") or [], sums)
    send_msg({"files": [[f.rel, f.size, f.mode, f.sha] for f in listing], "unmatched": tree.unmatched,
              "skipped": tree.skipped})
    want = read_msg(sys.stdin.buffer).get("want") or []
    by_rel = dict((f.rel, f) for f in listing)
    try:
        for rel, offset, prefix, have in want:
            if rel not in by_rel:
                raise Fail("%r was not in the listing" % (rel,), "protocol")
            entry = by_rel[rel]
            if have and sums.sha(entry.path, entry.st) == have:
                send_msg({"file": rel, "same": True})
            else:
                send_file(entry, int(offset), prefix, sums)
    finally:
        sums.save()
    send_msg({"done": True})
    return 0


class Entry:
    def __init__(self, rel, path, st, sha):
        self.rel, self.path, self.st, self.sha = rel, path, st, sha
        self.size, self.mode = st.st_size, stat.S_IMODE(st.st_mode)


def checkpoint_dir(root):
    """The run's checkpoint folder on this host: what its ranks got as CLUSTERRUN_CHECKPOINT_DIR."""
    spec = read_json(os.path.join(root, "spec.json")) or {}
    for env in [spec.get("env") or {}] + [r.get("env") or {} for r in spec.get("ranks", [])]:
        if env.get("CLUSTERRUN_CHECKPOINT_DIR"):
            return os.path.realpath(os.path.expanduser(env["CLUSTERRUN_CHECKPOINT_DIR"]))
    return os.path.realpath(os.path.join(root, "checkpoints"))


def _within(path, folder):
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class RunTree:
    """The files a pull may take: the job folder, the checkpoint folder; and what each PATH selects."""

    def __init__(self, root):
        self.run = os.path.realpath(root)
        self.job = os.path.realpath(job_dir(root))
        self.ckpt = checkpoint_dir(root)
        self.unmatched, self.skipped = [], []
        self._skipped = set()

    def place(self, text):
        """(folder, its name in the listing: "" or "checkpoints", the parts of PATH inside it)."""
        if "\0" in text or not text.strip("/. "):
            raise Fail("%r names nothing" % (text,), "outside", text)
        if text.startswith("/"):
            path = os.path.normpath(text)
            for folder, prefix in ((self.ckpt, "checkpoints"), (self.job, "")):
                if _within(path, folder):
                    return folder, prefix, _parts(os.path.relpath(path, folder))
            raise Fail("%s is outside the run's job folder and its checkpoint folder on this host" % text, "outside",
                       text)
        parts = _parts(text)
        if parts and parts[0] == "checkpoints" and not text.startswith("./"):
            return self.ckpt, "checkpoints", parts[1:]
        return self.job, "", parts

    def select(self, paths, sums):
        """Every file the PATHs select, once each, sorted; unmatched PATHs and skipped entries noted."""
        found = {}
        for text in paths:
            folder, prefix, parts = self.place(text)
            before = len(found)
            for rel, path, st in self.matches(folder, prefix, parts):
                if rel in found or rel in self._skipped:
                    continue
                if os.access(path, os.R_OK):
                    found[rel] = Entry(rel, path, st, sums.cached(path, st))
                else:
                    self._skipped.add(rel)
                    self.skipped.append([rel, "cannot read it: permission denied"])
            if len(found) == before and not self._any_match(folder, prefix, parts):
                self.unmatched.append(text)
        return [found[rel] for rel in sorted(found)]

    def _any_match(self, folder, prefix, parts):
        return any(True for _ in self.matches(folder, prefix, parts))

    def matches(self, folder, prefix, parts):
        """(name in the listing, real path, stat) of each file under folder that parts select."""
        fixed = []
        for part in parts:  # the literal folders before the first glob: the only part worth walking
            if any(c in part for c in GLOB_CHARS) or part == "**":
                break
            fixed.append(part)
        start = os.path.join(folder, *fixed) if fixed else folder
        for rel_parts, path, st in self.walk(folder, start):
            if len(fixed) == len(parts) or _selected(parts, rel_parts):
                yield "/".join(([prefix] if prefix else []) + rel_parts), path, st

    def walk(self, folder, start):
        """(parts relative to folder, real path, stat) of every regular file at or under start; symlinks
        followed only where they stay inside the run (or its checkpoint folder)."""
        parent = os.path.realpath(os.path.dirname(start))
        if start != folder and not (_within(parent, self.run) or _within(parent, self.ckpt)):
            self.skip(folder, start, "behind a symlink out of the run's folder: not followed")
            return
        target = self.resolve(folder, start)
        if target is None:
            return
        path, st = target
        if stat.S_ISREG(st.st_mode):
            yield _parts(os.path.relpath(start, folder)), path, st
            return
        if not stat.S_ISDIR(st.st_mode) or os.path.islink(start) and start != folder:
            if stat.S_ISDIR(st.st_mode):
                self.skip(folder, start, "a folder behind a symlink: not walked")
            return
        for found in self.walk_folder(folder, start):
            yield found

    def walk_folder(self, folder, start):
        """The regular files under the folder start (no symlinked folder walked), as walk yields them."""
        for base, dirs, files in os.walk(start):
            dirs.sort()
            for name in [d for d in dirs if os.path.islink(os.path.join(base, d))]:
                dirs.remove(name)
                self.skip(folder, os.path.join(base, name), "a folder behind a symlink: not walked")
            for name in sorted(files):
                found = self.resolve(folder, os.path.join(base, name))
                if found is not None and stat.S_ISREG(found[1].st_mode):
                    yield _parts(os.path.relpath(os.path.join(base, name), folder)), found[0], found[1]

    def resolve(self, folder, path):
        """(real path, stat) when path exists and stays inside the run; None otherwise (noted if a link)."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISLNK(st.st_mode):
            return path, st
        real = os.path.realpath(path)
        if not (_within(real, self.run) or _within(real, self.ckpt)):
            self.skip(folder, path, "a symlink out of the run's folder: not followed")
            return None
        try:
            return real, os.stat(real)
        except OSError:
            return None

    def skip(self, folder, path, why):
        rel = os.path.relpath(path, folder).replace(os.sep, "/")
        rel = "checkpoints/" + rel if folder == self.ckpt and folder != self.job else rel
        if rel not in self._skipped:
            self._skipped.add(rel)
            self.skipped.append([rel, why])


def _parts(text):
    parts = [p for p in text.replace(os.sep, "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Fail("%r leads out of the run's folder (..)" % (text,), "outside", text)
    return parts


def _match(pattern, parts):
    """Whether the pattern's names match these names exactly (`**`: any number of them)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(pattern[1:], parts[1:])


def _selected(pattern, parts):
    """A file is selected when the pattern matches it or a folder it is in."""
    return any(_match(pattern, parts[:k]) for k in range(1, len(parts) + 1))


class Sums:
    """SHA-256 of files by (size, mtime, ctime, inode): a file rewritten in place cannot put its ctime back."""

    def __init__(self, path):
        self.path = path
        self.known = (read_json(path) or {}).get("files") or {}
        self.dirty = False

    def cached(self, path, st):
        """The file's SHA-256 if remembered for it as it is now, else None."""
        hit = self.known.get(path)
        return hit[4] if hit and hit[:4] == _look(st) else None

    def sha(self, path, st):
        found = self.cached(path, st)
        if found is not None:
            return found
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                digest.update(chunk)
        self.note(path, st, digest.hexdigest())
        return digest.hexdigest()

    def note(self, path, st, sha):
        self.known.pop(path, None)  # re-inserted last: the newest stay when the file is cut down
        self.known[path] = _look(st) + [sha]
        self.dirty = True

    def save(self):
        if not self.dirty:
            return
        entries = list(self.known.items())[-MAX_SUMS:]  # insertion order: the ones hashed last stay
        tmp = "%s.tmp-%d" % (self.path, os.getpid())
        try:
            os.makedirs(os.path.dirname(self.path), 0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({"version": 1, "files": dict(entries)}, fh)
            os.replace(tmp, self.path)
        except OSError:  # a cache: a full disk only costs the next pull a re-read
            pass


def _look(st):
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def send_file(entry, offset, prefix, sums):
    """The file from offset (from 0 when the controller's first bytes are not the file's), at most the size
    listed, as chunks; then the SHA-256 of the whole of what the controller now holds (remembered when it
    is the whole file, unchanged since it was listed)."""
    out = sys.stdout.buffer
    digest = hashlib.sha256()
    with open(entry.path, "rb") as fh:
        if offset and not (0 < offset <= entry.size and prefix and _prefix_sha(fh, offset, digest) == prefix):
            offset, digest = 0, hashlib.sha256()
            fh.seek(0)
        send_msg({"file": entry.rel, "offset": offset})
        left = entry.size - offset
        while left > 0:
            data = fh.read(min(CHUNK, left))
            if not data:  # it shrank since it was listed: what there is
                break
            digest.update(data)
            out.write(CHUNK_LEN.pack(len(data)))
            out.write(data)
            left -= len(data)
        out.write(CHUNK_LEN.pack(0))
        unchanged = left == 0 and _look(os.fstat(fh.fileno())) == _look(entry.st)
    if unchanged:
        sums.note(entry.path, entry.st, digest.hexdigest())
    send_msg({"sha256": digest.hexdigest(), "size": entry.size - max(left, 0)})


def _prefix_sha(fh, n, digest):
    """Hash the first n bytes into digest (so that it goes on over the rest); its hex digest so far."""
    left = n
    while left:
        data = fh.read(min(CHUNK, left))
        if not data:
            return None
        digest.update(data)
        left -= len(data)
    return digest.copy().hexdigest()
