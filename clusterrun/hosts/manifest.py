"""What to push: the job's files under its root, by content hash, with .gitignore-style excludes.

Hosts keep a content-addressed cache, so a push sends only objects a host has never seen; the run
folder is then made of hard links to them. Hashes are cached here by (size, mtime, inode), so an
unchanged re-launch neither reads nor sends the data again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import UsageError
from ..config.inventory import Job, entry_paths


@dataclass(frozen=True)
class FileEntry:
    rel: str  # POSIX path under the job root
    sha: str
    size: int
    executable: bool
    source: str  # absolute path here


@dataclass(frozen=True)
class Manifest:
    files: Tuple[FileEntry, ...]
    dirs: Tuple[str, ...]
    symlinks: Tuple[Tuple[str, str], ...]  # (rel, relative target)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def wire(self) -> dict:
        return {"files": [[f.rel, f.sha, f.size, f.executable] for f in self.files], "dirs": list(self.dirs),
                "symlinks": [list(s) for s in self.symlinks]}

    def object_order(self) -> Dict[str, int]:
        """Each object's place in the manifest (a relay streams objects in this order)."""
        out: Dict[str, int] = {}
        for f in self.files:
            out.setdefault(f.sha, len(out))
        return out

    def objects(self) -> Dict[Tuple[str, bool], FileEntry]:
        """One file per distinct object (content and exec bit), the unit that is sent."""
        out: Dict[Tuple[str, bool], FileEntry] = {}
        for f in self.files:
            out.setdefault((f.sha, f.executable), f)
        return out


def _pattern_regex(pattern: str) -> Tuple[re.Pattern, bool, bool]:
    """One .gitignore line → (regex over the relative path, negated, directories only)."""
    negated = pattern.startswith("!")
    if negated:
        pattern = pattern[1:]
    dir_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    anchored = "/" in pattern
    pattern = pattern.lstrip("/")
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                out.append("[" + pattern[i + 1:j].replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    body = "".join(out)
    regex = ("^" if anchored else "^(?:.*/)?") + body + "$"
    return re.compile(regex), negated, dir_only


class Excludes:
    """Last matching pattern wins, `!` re-includes, `dir/` matches directories only (as in .gitignore)."""

    def __init__(self, patterns: Iterable[str]):
        self._rules = [_pattern_regex(p.strip()) for p in patterns if p.strip() and not p.strip().startswith("#")]

    def excluded(self, rel: str, is_dir: bool) -> bool:
        result = False
        for regex, negated, dir_only in self._rules:
            if dir_only and not is_dir:
                continue
            if regex.match(rel):
                result = not negated
        return result


class HashCache:
    """sha256 of files here, remembered by (size, mtime_ns, ctime_ns, inode) in one JSON file (0600): a
    rewrite that puts size and mtime back cannot put the ctime back."""

    VERSION = 2

    def __init__(self, path: Optional[str]):
        self.path = path
        self._entries: Dict[str, list] = {}
        self._dirty = False
        if path and os.path.exists(path):
            try:
                with open(path) as fh:
                    data = json.load(fh)
                if data.get("version") == self.VERSION:
                    self._entries = data["entries"]
            except (OSError, ValueError, KeyError):
                self._entries = {}

    def sha(self, path: str, st: os.stat_result) -> str:
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        hit = self._entries.get(path)
        if hit and hit[:4] == key:
            return hit[4]
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        self._entries[path] = key + [digest.hexdigest()]
        self._dirty = True
        return digest.hexdigest()

    def note(self, path: str, st: os.stat_result, sha: str) -> None:
        """A file whose SHA-256 is known without reading it (it was checked as it was written)."""
        self._entries[path] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha]
        self._dirty = True

    def save(self) -> None:
        if not (self.path and self._dirty):
            return
        tmp = f"{self.path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"version": self.VERSION, "entries": self._entries}, fh)
        os.replace(tmp, self.path)
        self._dirty = False


def build_manifest(job: Job, cache: HashCache, extra: Optional[Mapping[str, str]] = None) -> Manifest:
    """Every file to push: the script and the sync paths, minus excludes; symlinks must stay inside root.
    extra: job-relative path → a file elsewhere here (wheels: controller's downloads), pushed as job files."""
    walk = _Walk(job, cache)
    env = [job.environment.requirements] if job.environment else []  # the venv is built from it on the host
    for rel in entry_paths(job) + env + [s.rstrip("/") for s in job.sync]:
        walk.add_path(rel)
    for rel, full in sorted((extra or {}).items()):
        parts = rel.split("/")
        walk.dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        walk.add_file(rel, full)
    cache.save()
    return walk.manifest()


class _Walk:
    """Collects files, folders and symlinks under the job root, honouring the excludes."""

    def __init__(self, job: Job, cache: HashCache):
        self.root = os.path.realpath(job.root)
        self.cache = cache
        self.excludes = Excludes(job.exclude)
        self.files: Dict[str, FileEntry] = {}
        self.dirs: set = set()
        self.links: Dict[str, str] = {}

    def inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def add_path(self, rel: str) -> None:
        """A path the job names (script or sync entry): a file, a symlink, or a folder walked whole."""
        full = os.path.join(self.root, rel) if rel != "." else self.root
        if not os.path.lexists(full):
            raise UsageError(f"{full} does not exist (job.script / job.sync)")
        real = os.path.realpath(full)
        if not self.inside(real):
            raise UsageError(f"{full} resolves to {real}, outside the job root {self.root}")
        if os.path.isdir(full) and not os.path.islink(full):
            if rel != ".":
                self.dirs.add(rel)
            self.walk("" if rel == "." else rel)
        else:
            self.add_file(rel, full)

    def add_file(self, rel: str, full: str) -> None:
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            real = os.path.realpath(full)
            if not self.inside(real):
                raise UsageError(f"{full} is a symlink to {real}, outside the job root {self.root}; "
                                 "clusterrun does not follow links out of the project")
            target = os.path.relpath(real, os.path.dirname(os.path.join(self.root, rel)))
            self.links[rel] = target.replace(os.sep, "/")
            return
        if not stat.S_ISREG(st.st_mode):
            return  # sockets, fifos, devices: nothing to push
        self.files[rel] = FileEntry(rel=rel, sha=self.cache.sha(full, st), size=st.st_size,
                                    executable=bool(st.st_mode & 0o111), source=full)

    def walk(self, rel_dir: str) -> None:
        full_dir = os.path.join(self.root, rel_dir) if rel_dir else self.root
        try:
            names = sorted(os.listdir(full_dir))
        except OSError as exc:
            raise UsageError(f"cannot read {full_dir}: {exc.strerror}") from None
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(full_dir, name)
            is_dir = os.path.isdir(full) and not os.path.islink(full)
            if self.excludes.excluded(rel, is_dir):
                continue
            if is_dir:
                self.dirs.add(rel)
                self.walk(rel)
            else:
                self.add_file(rel, full)

    def manifest(self) -> Manifest:
        for rel in list(self.files) + list(self.links):  # every parent folder of what is pushed
            parent = rel.rpartition("/")[0]
            while parent:
                self.dirs.add(parent)
                parent = parent.rpartition("/")[0]
        return Manifest(files=tuple(self.files[k] for k in sorted(self.files)), dirs=tuple(sorted(self.dirs)),
                        symlinks=tuple(sorted(self.links.items())))


def read_chunks(path: str, size: int, chunk: int = 1 << 20) -> Iterable[bytes]:
    """The file's bytes in chunks; exactly `size` of them (it must not change during the push)."""
    left = size
    with open(path, "rb") as fh:
        while left:
            data = fh.read(min(chunk, left))
            if not data:
                raise UsageError(f"{path} shrank while it was being pushed")
            left -= len(data)
            yield data


def objects_to_send(manifest: Manifest, missing: Sequence[Tuple[str, Optional[bool]]]) -> List[FileEntry]:
    """The entries to read for these objects, in this order; (sha, None): either mode will do."""
    objects = manifest.objects()
    out = []
    for sha, exe in missing:
        entry = objects.get((sha, exe)) if exe is not None else objects.get((sha, True)) or objects.get((sha, False))
        if entry is None:
            raise UsageError(f"the host asked for an object not in the manifest: {sha}")
        out.append(entry)
    return out
