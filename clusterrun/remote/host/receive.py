"""The push's receiving end: objects the content cache lacks arrive framed on stdin, are checked
against their SHA-256, and the run's job folder is built from hard links to them.

Protocol (framed JSON messages, common.read_msg/send_msg; object bytes raw in between):
  controller → manifest {files: [[rel, sha256, size, exec]], dirs, symlinks, hold, free_port, check_port,
                         master_addr}
  host       → {missing: [sha256...], port, facts}  or  {error, kind, path}
  controller → the missing objects' bytes, back to back, in the order asked
  host       → {ok, received, objects, files}  or  {error, kind, path}
  (hold only) controller → {setup: {...}}; host → setup.py's messages      (only where job.setup is set)
  (hold only) controller → {start: spec};  host → {state}     (end of input instead: the run is removed)
"""

import errno
import hashlib
import os
import platform
import shutil
import socket
import sys

from .common import CHUNK, Fail, free_port, read_msg, send_msg
from .setup import run_setup
from .supervise import start_run


def host_facts(port, master_addr):
    """What launch's preflight needs to know, found while the push goes on (no extra round trip)."""
    facts = {"python": platform.python_version(), "executable": sys.executable}
    if port:  # rank 0's fixed master port must be free, bound the way torch's store binds it
        family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::" if family == socket.AF_INET6 else "", port))
            facts["port"] = {"free": True, "port": port}
        except OSError as exc:
            facts["port"] = {"free": False, "port": port, "error": "%s (%s)" % (
                os.strerror(exc.errno) if exc.errno else exc, errno.errorcode.get(exc.errno, "?"))}
        finally:
            sock.close()
    return facts


def safe_rel(path):
    parts = path.split("/")
    if not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise Fail("unsafe path in manifest: %r" % path, "protocol")
    return os.path.join(*parts)


def object_path(cache, sha, executable):
    return os.path.join(cache, sha[:2], sha + ("-x" if executable else ""))


def cmd_receive(workdir, run_dir):
    """Receive objects the host's content cache lacks, then build RUN_DIR/job from hard links."""
    push = Push(workdir, run_dir)
    try:
        return push.run()
    except BaseException:
        # The controller went away at any other point (a broken pipe while answering, say): a run folder
        # this push made and that never started must not stay behind, nor the objects it added.
        if push.made_run_dir and not os.path.exists(os.path.join(run_dir, "spec.json")):
            push.undo()
        raise


class Push:
    """One push into one run folder; remembers what it made, so a failure can take it all back."""

    def __init__(self, workdir, run_dir):
        self.workdir = workdir
        self.cache = os.path.join(workdir, "cache", "objects")
        self.run_dir = run_dir
        self.stdin = sys.stdin.buffer
        self.made_run_dir = False
        self.created = []  # objects this push added to the cache
        self.received = 0  # object bytes read from the controller so far
        self.current = ""  # the path being written (named in an error)
        self._folders = set()  # folders known to exist: a makedirs per file was most of a small-file push

    def run(self):
        manifest = read_msg(self.stdin)
        files = manifest["files"]  # [relpath, sha256, size, executable]
        missing = self.missing(files)
        need = sum(size for _, size, _ in missing)
        refusal = self.refusal(need)
        if refusal:
            send_msg(refusal)
            return 1
        send_msg({"missing": [sha for sha, _, _ in missing],
                  "port": free_port() if manifest.get("free_port") else None,
                  "facts": host_facts(manifest.get("check_port"), manifest.get("master_addr", ""))})
        try:
            for sha, size, exe in missing:
                self.receive_object(sha, size, exe)
            self.build_tree(manifest, files)
        except (OSError, Fail) as exc:
            self.undo()
            self.drain(need - self.received)  # so that the controller gets to read the answer
            send_msg(self.answer(exc))
            return 1
        send_msg({"ok": True, "received": self.received, "objects": len(missing), "files": len(files)})
        if manifest.get("hold"):
            self.hold_for_start()
        return 0

    def missing(self, files):
        """[sha, size, exec] of each object the cache lacks, once; every path and id checked first."""
        for rel, sha, _, _ in files:
            safe_rel(rel)
            if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise Fail("bad object id %r" % sha, "protocol")
        missing, seen = [], set()
        for _, sha, size, exe in files:
            key = (sha, bool(exe))
            if key not in seen and not os.path.exists(object_path(self.cache, sha, exe)):
                missing.append([sha, size, bool(exe)])
            seen.add(key)
        return missing

    def refusal(self, need):
        """Why this push cannot go ahead (no room, a run folder already there), or None once it is made."""
        os.makedirs(self.cache, 0o700, exist_ok=True)
        free = shutil.disk_usage(self.cache).free
        if need > free:
            return {"missing": [], "error": "not enough disk space: the push needs %d bytes, %d free" % (need, free),
                    "kind": "disk_full", "path": self.cache}
        try:
            os.makedirs(os.path.dirname(self.run_dir), 0o700, exist_ok=True)
            os.mkdir(self.run_dir, 0o700)
        except FileExistsError:
            return {"missing": [], "error": "run folder already exists", "kind": "exists", "path": self.run_dir}
        self.made_run_dir = True
        return None

    def folder(self, path):
        if path not in self._folders:
            os.makedirs(path, 0o700, exist_ok=True)
            self._folders.add(path)

    def receive_object(self, sha, size, exe):
        """One object from stdin into the cache, hashed as it is written; it enters only if it matches."""
        final = object_path(self.cache, sha, exe)
        self.current = final
        self.folder(os.path.dirname(final))
        tmp = "%s.tmp-%d" % (final, os.getpid())
        digest = hashlib.sha256()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o555 if exe else 0o444)
        try:
            left = size
            while left:
                chunk = self.stdin.read(min(left, CHUNK))
                if not chunk:
                    raise Fail("the controller went away during the push", "aborted")
                self.received += len(chunk)
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                left -= len(chunk)
            os.close(fd)
            fd = -1
            if digest.hexdigest() != sha:
                raise Fail("content of %s arrived corrupted" % sha, "corrupt")
            os.replace(tmp, final)
            self.created.append(final)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            os.unlink(tmp)
            raise

    def build_tree(self, manifest, files):
        """RUN_DIR/job: the folders, a hard link per file into the cache, and the symlinks."""
        job = os.path.join(self.run_dir, "job")
        os.mkdir(job, 0o700)
        self._folders.add(job)
        for rel in manifest.get("dirs", []):
            self.folder(os.path.join(job, safe_rel(rel)))
        for rel, sha, _, exe in files:
            dest = os.path.join(job, safe_rel(rel))
            self.current = dest
            self.folder(os.path.dirname(dest))
            src = object_path(self.cache, sha, exe)
            try:
                os.link(src, dest)
            except OSError:
                shutil.copy2(src, dest)  # another file system, or too many links
        for rel, target in manifest.get("symlinks", []):
            dest = os.path.join(job, safe_rel(rel))
            resolved = os.path.normpath(os.path.join(os.path.dirname(dest), target))
            if target.startswith("/") or not resolved.startswith(job + os.sep):
                raise Fail("symlink %s points out of the job (%s)" % (rel, target), "protocol", rel)
            os.makedirs(os.path.dirname(dest), 0o700, exist_ok=True)
            os.symlink(target, dest)

    def undo(self):
        """Nothing has started: leave no partial run behind, and give the space back (the disk may be full)."""
        shutil.rmtree(self.run_dir, ignore_errors=True)
        for path in self.created:
            try:
                os.unlink(path)
            except OSError:
                pass

    def drain(self, left):
        """Read (and drop) what the controller still sends."""
        while left > 0:
            chunk = self.stdin.read(min(left, CHUNK))
            if not chunk:
                break
            left -= len(chunk)

    def answer(self, exc):
        if isinstance(exc, OSError):
            kind = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "os"
            exc = Fail(os.strerror(exc.errno) if exc.errno else str(exc), kind, self.current)
        return {"error": str(exc), "kind": exc.kind, "path": exc.path}

    def hold_for_start(self):
        """Hold the channel for the setup and the start (saves a connection round trip and an interpreter
        start-up); end of input instead means the controller is gone or will not start: leave no
        half-made run."""
        try:
            message = read_msg(self.stdin)
            if "setup" in message:
                run_setup(self.workdir, self.run_dir, message["setup"], self.stdin)
                message = read_msg(self.stdin)
        except (Fail, EOFError):
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        send_msg({"state": start_run(self.run_dir, message["start"])})
