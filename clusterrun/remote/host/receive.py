"""The push's receiving end: objects the content cache lacks arrive framed on stdin, are checked
against their SHA-256, and the run's job folder is built from hard links to them."""

import errno
import hashlib
import os
import platform
import shutil
import socket
import sys

from .common import CHUNK, Fail, free_port, read_msg, send_msg
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


def cmd_sync(workdir, run_dir):
    """Receive objects the host's content cache lacks, then build RUN_DIR/job from hard links."""
    mine = {"run_dir": False, "created": []}
    try:
        return receive(workdir, run_dir, mine)
    except BaseException:
        # The controller went away at any other point (a broken pipe while answering, say): a run folder
        # this push made and that never started must not stay behind, nor the objects it added.
        if mine["run_dir"] and not os.path.exists(os.path.join(run_dir, "spec.json")):
            shutil.rmtree(run_dir, ignore_errors=True)
            for path in mine["created"]:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        raise


def receive(workdir, run_dir, mine):
    cache = os.path.join(workdir, "cache", "objects")
    stdin = sys.stdin.buffer
    manifest = read_msg(stdin)
    files = manifest["files"]  # [relpath, sha256, size, executable]
    for rel, sha, _, _ in files:
        safe_rel(rel)
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise Fail("bad object id %r" % sha, "protocol")
    missing, seen = [], set()
    for _, sha, size, exe in files:
        key = (sha, bool(exe))
        if key not in seen and not os.path.exists(object_path(cache, sha, exe)):
            missing.append([sha, size, bool(exe)])
        seen.add(key)
    need = sum(size for _, size, _ in missing)
    os.makedirs(cache, 0o700, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if need > free:
        send_msg({"missing": [], "error": "not enough disk space: the push needs %d bytes, %d free" % (need, free),
                  "kind": "disk_full", "path": cache})
        return 1
    try:
        os.makedirs(os.path.dirname(run_dir), 0o700, exist_ok=True)
        os.mkdir(run_dir, 0o700)
        mine["run_dir"] = True
    except FileExistsError:
        send_msg({"missing": [], "error": "run folder already exists", "kind": "exists", "path": run_dir})
        return 1
    send_msg({"missing": [sha for sha, _, _ in missing], "port": free_port() if manifest.get("free_port") else None,
              "facts": host_facts(manifest.get("check_port"), manifest.get("master_addr", ""))})
    received = 0  # bytes of objects read from the controller so far
    current = ""
    created = mine["created"]  # objects this push added to the cache: removed again if the push fails
    made = set()  # folders known to exist: a makedirs per file was most of a small-file push's time

    def folder(path):
        if path not in made:
            os.makedirs(path, 0o700, exist_ok=True)
            made.add(path)

    try:
        for sha, size, exe in missing:
            final = object_path(cache, sha, exe)
            current = final
            folder(os.path.dirname(final))
            tmp = "%s.tmp-%d" % (final, os.getpid())
            digest = hashlib.sha256()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o555 if exe else 0o444)
            try:
                left = size
                while left:
                    chunk = stdin.read(min(left, CHUNK))
                    if not chunk:
                        raise Fail("the controller went away during the push", "aborted")
                    received += len(chunk)
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
                created.append(final)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                os.unlink(tmp)
                raise
        job = os.path.join(run_dir, "job")
        os.mkdir(job, 0o700)
        made.add(job)
        for rel in manifest.get("dirs", []):
            folder(os.path.join(job, safe_rel(rel)))
        for rel, sha, _, exe in files:
            dest = os.path.join(job, safe_rel(rel))
            current = dest
            folder(os.path.dirname(dest))
            src = object_path(cache, sha, exe)
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
    except (OSError, Fail) as exc:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing has started: leave no partial run behind
        for path in created:  # and give the space back (the disk may be what is full)
            try:
                os.unlink(path)
            except OSError:
                pass
        if isinstance(exc, OSError):
            kind = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "os"
            message = os.strerror(exc.errno) if exc.errno else str(exc)
            exc = Fail(message, kind, current)
        left = need - received  # take what the controller still sends, so that it gets to read this answer
        while left > 0:
            chunk = stdin.read(min(left, CHUNK))
            if not chunk:
                break
            left -= len(chunk)
        send_msg({"error": str(exc), "kind": exc.kind, "path": exc.path})
        return 1
    send_msg({"ok": True, "received": received, "objects": len(missing), "files": len(files)})
    if not manifest.get("hold"):
        return 0
    # Hold the channel for the start (saves a connection round trip and an interpreter start-up);
    # end of input instead means the controller is gone or will not start: leave no half-made run.
    try:
        message = read_msg(stdin)
    except Fail:
        shutil.rmtree(run_dir, ignore_errors=True)
        return 0
    send_msg({"state": start_run(run_dir, message["start"])})
    return 0
