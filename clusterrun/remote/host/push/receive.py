"""The push's receiving end: objects the content cache lacks (disk/cache.py) arrive framed on stdin, or
from the host before this one in the relay's chain (relay.py), are checked against their SHA-256, and
the run's job folder is built from hard links to them.

Protocol (framed JSON messages, wire.read_msg/send_msg; object bytes raw in between):
  controller → manifest {files: [[rel, sha256, size, exec]], dirs, symlinks, hold, free_port, check_port,
                         master_addr, env_base (job.environment's base interpreter, described in the facts),
                         fingerprint (the plain python's stack fingerprint wanted in the facts)}
  host       → {missing: [sha256...], repaired: [sha256...], port, facts (facts.py)}  or  {error, kind, path}
  controller → the missing objects' bytes, back to back, in the order asked
  host       → {ok, received, objects, files}  or  {error, kind, path}
  (hold only) the held session: the environment, the setup, the start or the wait, the follow (held.py)
With a claim request in the manifest ("claim", share/session.py) the host first claims its share of this
host (or answers busy, or queues), the first answer says what it took, and the controller's word
({confirm} or {requeue}) comes before any object; the run folder is made only after {confirm}. The
supervisor adopts the claim at the start; a push that ends otherwise removes it.
"""

import errno
import os
import sys
import time

from ..disk.cache import CacheIndex, object_path, safe_rel
from ..disk.lock import LOCK_WAIT, cache_lock, hold_receiving
from ..net import bind_address, free_port
from ..wire import CHUNK, Fail, read_msg, send_msg
from .facts import host_facts
from .held import hold

RUN_RESERVE = 256 << 10  # a run's own files on this host: spec, state, exit records, the logs' first lines
REQUEUE = "requeue"  # _run's word that the launch wants another round of claims before it pushes


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
    finally:
        if push.claim is not None:
            push.claim.close()  # unless the supervisor adopted it


class StdinSource:
    """Object bytes from the controller (the SSH channel's stdin)."""

    def __init__(self, stream):
        self.stream = stream
        self.bytes = 0

    def readinto(self, view):
        n = self.stream.readinto(view)
        if not n:
            raise Fail("the controller went away during the push", "aborted")
        self.bytes += n
        return n


class Push:
    """One push into one run folder; remembers what it made, so a failure can take it all back."""

    def __init__(self, workdir, run_dir):
        self.workdir = workdir
        self.cache = os.path.join(workdir, "cache", "objects")
        self.run_dir = run_dir
        self.stdin = sys.stdin.buffer
        self.index = CacheIndex(self.cache)
        self.repaired = []  # objects found changed in the cache: fetched again
        self.made_run_dir = False
        self.created = []  # objects this push added to the cache
        self.source = StdinSource(self.stdin)  # object bytes from the controller
        self.expect = 0  # how many the controller sends in this phase (drained after an error)
        self.relayed = 0  # object bytes that came from the upstream host (relay.py)
        self.relay_notes = []  # what went wrong on the relay path (the push then fell back to direct)
        self.downstream = None  # the socket to the next host in the relay chain
        self.coordinator = None  # rank 0's host: the peers' listening socket, handed to the supervisor
        self.buf = memoryview(bytearray(CHUNK))  # one buffer for every read: no allocation per chunk
        self.current = ""  # the path being written (named in an error)
        self.lock = None  # the cache's lock, shared (clean.py)
        self.addr = ""  # this host's own address (the inventory's): relay sockets bind it
        self._folders = set()  # folders known to exist: a makedirs per file was most of a small-file push
        self.claim = None  # this run's claim on the host (share/session.py), when the launch claims
        self.wait_server = None  # --detach --wait, rank 0's host: where the other hosts' waiters join
        # where the push's time went here (wall clock; seconds spent hashing, writing, passing on): the
        # relay bench reads them from the run record (bench/sections/relay.py)
        self.timing = {"hash_s": 0.0, "write_s": 0.0, "pass_s": 0.0}

    @property
    def received(self):
        return self.source.bytes

    def run(self):
        manifest = read_msg(self.stdin)
        files = manifest["files"]  # [relpath, sha256, size, executable]
        if manifest.get("claim"):
            from ..share.session import ClaimSession  # here: a launch that claims nothing never loads claims

            self.claim = ClaimSession(manifest["claim"], self.stdin, send_msg)
        while True:
            if self.claim is not None and not self.claim.acquire():
                return 1  # busy: said so, nothing made
            # shared with other pushes, exclusive of a cache sweep (clean.py): from deciding what the cache
            # has until every object is linked into the run folder
            self.lock = cache_lock(self.workdir, exclusive=False, wait=LOCK_WAIT * 2)
            if self.lock is None:
                raise Fail("the content cache stayed locked (a `clusterrun clean --cache` on this host?)", "busy",
                           self.cache)
            try:
                code = self._run(manifest, files)
            finally:
                self.release()
            if code != REQUEUE:
                return code

    def release(self):
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def _run(self, manifest, files):
        missing = self.missing(files)
        need = sum(size for _, size, _ in missing)
        refusal = self.refusal(need, make_dir=self.claim is None)
        if refusal:
            send_msg(refusal)
            return 1
        server = self.first_answer(manifest, missing)
        if self.claim is not None and not self.claim.decide():
            for sock in (server, self.coordinator):
                if sock is not None:
                    sock.close()
            self.coordinator = None
            return REQUEUE  # another host of the launch is busy: back in line, then answer again
        try:
            if not self.made_run_dir:
                self.make_run_dir()
            if server is not None:
                self.receive_relayed(read_msg(self.stdin)["relay"], missing, server)
            else:
                self.expect = need
                for sha, size, exe in missing:
                    self.receive_object(sha, size, exe, self.source)
            self.build_tree(manifest, files)
        except (OSError, Fail) as exc:
            self.undo()
            self.drain(self.expect - self.received)  # so that the controller gets to read the answer
            send_msg(self.answer(exc))
            return 1
        finally:
            if server is not None:
                server.close()
        self.index.flush()
        self.release()  # every object is linked into the run folder now: a sweep leaves them be
        send_msg({"ok": True, "received": self.received, "relayed": self.relayed, "relay_notes": self.relay_notes,
                  "objects": len(missing), "files": len(files), "timing": self.timing})
        if manifest.get("hold"):
            hold(self)
        return 0

    def first_answer(self, manifest, missing):
        """What the cache lacks, the ports bound, the facts, the claim; the relay's listening socket (or None)."""
        own = self.addr = manifest.get("addr") or ""  # this host's address in the inventory
        server = bind_address(own) if manifest.get("relay") else None
        if manifest.get("coordinator"):  # bound now, inherited by the supervisor: every host can start at once
            self.coordinator = bind_address(own)
            if self.claim is not None and self.claim.conf.get("detach") and self.claim.conf.get("wait"):
                self.wait_server = bind_address(own)  # the waiters' meeting point, should the launch wait
        send_msg({"missing": [sha for sha, _, _ in missing], "missing_objects": missing, "repaired": self.repaired,
                  "port": free_port() if manifest.get("free_port") else None,
                  "relay_port": server.getsockname()[1] if server else None,
                  "coordinator_port": self.coordinator.getsockname()[1] if self.coordinator else None,
                  "facts": host_facts(manifest.get("check_port"), manifest.get("master_addr", ""), self.workdir,
                                     manifest.get("env_base"), manifest.get("fingerprint")),
                  "claim": self.claim.answer() if self.claim is not None else None,
                  "wait_port": self.wait_server.getsockname()[1] if self.wait_server else None})
        return server

    def receive_relayed(self, conf, missing, server):
        """Objects in the order of the chain's stream (conf["objects"]): from the controller (the chain's
        first host) or the upstream host; keep the ones this host lacks, pass on the ones the next host
        wants while they arrive. Whatever fails on the relay path, the rest comes from the controller."""
        # when the chain was laid out (the controller's clock), and this host's place in it
        self.timing.update(node=conf["node"], laid_out=conf.get("laid_out"))
        from . import relay  # here: a push without relay: never loads it (nor the channel kit)

        want = {(sha, bool(exe)): [sha, size, exe] for sha, size, exe in missing}
        done = set()
        run = os.path.basename(self.run_dir)
        forward = self._open_downstream(conf, run)
        source = self.source
        try:
            source = self._relay_source(conf, server, run)
            for sha, size, exe in conf["objects"]:
                key = (sha, bool(exe))
                keep = key in want and key not in done
                self.receive_object(sha, size, exe, source, keep=keep, forward=key in forward)
                if keep:
                    done.add(key)
        except relay.RelayError as exc:
            self._relay_failed(exc, [obj for key, obj in want.items() if key not in done])
        finally:
            self.close_downstream()
            if source is not self.source:
                self.relayed = source.bytes
                source.close()

    def _open_downstream(self, conf, run):
        """Connect to the next host of the chain, if there is one; the keys of the objects to pass on to it
        (none when it cannot be reached: it falls back on its own)."""
        from . import relay

        down = conf.get("downstream")
        if down:
            try:
                self.downstream = relay.connect_downstream(down["addr"], down["port"], conf["token"], run,
                                                           down["node"], conf["wait"], source=self.addr)
            except relay.RelayError as exc:
                self.relay_notes.append("next host %s: %s" % (down["name"], exc))
        return {(sha, bool(exe)) for sha, _, exe in down["objects"]} if self.downstream else set()

    def _relay_source(self, conf, server, run):
        """Where the chain's stream comes from: the controller's stdin (the chain's first host), or the
        upstream host once it connected and proved it belongs to this push."""
        if conf["from"] == "controller":
            self.expect = sum(size for _, size, _ in conf["objects"])
            return self.source
        from . import relay

        return relay.SocketSource(relay.accept_upstream(server, conf["token"], run, conf["node"], conf["wait"],
                                                        upstream=conf.get("upstream_addr") or ""),
                                  conf["timeout"])

    def _relay_failed(self, exc, rest):
        """The relay path failed: tell the controller, which sends the rest (the objects not kept yet)."""
        self.close_downstream()  # the hosts after this one fall back too, at once
        self.relay_notes.append("from the upstream host: %s" % exc)
        send_msg({"relay_failed": str(exc), "need": [sha for sha, _, _ in rest]})
        self.expect = sum(size for _, size, _ in rest)
        for sha, size, exe in rest:
            self.receive_object(sha, size, exe, self.source)

    def close_downstream(self):
        if self.downstream is not None:
            self.downstream.close()
            self.downstream = None

    def pass_on(self, chunk):
        """Bytes to the next host; if it went away it falls back on its own: stop sending, go on here."""
        if self.downstream is not None:
            try:
                self.downstream.sendall(chunk)
            except OSError as exc:
                self.relay_notes.append("next host: %s" % (exc.strerror or exc))
                self.close_downstream()

    def missing(self, files):
        """[sha, size, exec] of each object the cache lacks (or holds changed), once; every path, id and
        size checked first."""
        for rel, sha, size, _ in files:
            safe_rel(rel)
            if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise Fail("bad object id %r" % (sha,), "protocol")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise Fail("bad size %r for %s" % (size, rel), "protocol")
        missing, seen = [], set()
        for _, sha, size, exe in files:
            key = (sha, bool(exe))
            if key not in seen:
                found = self.index.check(sha, exe, size, object_path(self.cache, sha, exe))
                if found != "ok":
                    missing.append([sha, size, bool(exe)])
                if found == "changed":
                    self.repaired.append(sha)
            seen.add(key)
        return missing

    def refusal(self, need, make_dir=True):
        """Why this push cannot go ahead (no room, a run folder already there), or None once it is made
        (make_dir: now; with a claim, only once the launch confirmed it)."""
        os.makedirs(self.cache, 0o700, exist_ok=True)
        st = os.statvfs(self.cache)
        free = st.f_bavail * st.f_frsize  # as shutil.disk_usage
        if need + RUN_RESERVE > free:  # a push that fits but leaves no room to start is refused now, not later
            return {"missing": [], "error": "not enough disk space: the push needs %d bytes (and the run %d more "
                    "for its own files), %d free" % (need, RUN_RESERVE, free), "kind": "disk_full", "path": self.cache}
        if os.path.exists(self.run_dir):
            return {"missing": [], "error": "run folder already exists", "kind": "exists", "path": self.run_dir}
        if make_dir:
            try:
                self.make_run_dir()
            except Fail as exc:
                return {"missing": [], "error": str(exc), "kind": exc.kind, "path": exc.path}
        return None

    def make_run_dir(self):
        try:
            os.makedirs(os.path.dirname(self.run_dir), 0o700, exist_ok=True)
            os.mkdir(self.run_dir, 0o700)
        except FileExistsError:
            raise Fail("run folder already exists", "exists", self.run_dir) from None
        self.made_run_dir = True
        hold_receiving(self.run_dir)  # kept open until this process ends: `clean` leaves the folder alone

    def folder(self, path):
        if path not in self._folders:
            os.makedirs(path, 0o700, exist_ok=True)
            self._folders.add(path)

    def receive_object(self, sha, size, exe, source, keep=True, forward=False):
        """One object from source (read into one reused buffer) into the cache, hashed as it is written; it
        enters only if it matches. keep=False: only passed on (forward: to the next host, as it arrives)."""
        final = object_path(self.cache, sha, exe)
        tmp, fd, digest = None, -1, None
        if keep:
            self.current = final
            self.folder(os.path.dirname(final))
            tmp = "%s.tmp-%d" % (final, os.getpid())
            import hashlib  # only a push that sends something pays for loading it

            digest = hashlib.sha256()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o555 if exe else 0o444)
        timing, clock = self.timing, time.perf_counter
        try:
            left = size
            while left:
                n = source.readinto(self.buf[:min(left, len(self.buf))])
                t0 = clock()
                timing.setdefault("first", time.time())
                chunk = self.buf[:n]
                if forward:
                    self.pass_on(chunk)
                t1 = clock()
                if keep:
                    digest.update(chunk)
                    t2 = clock()
                    while chunk:
                        chunk = chunk[os.write(fd, chunk):]
                    timing["hash_s"] += t2 - t1
                    timing["write_s"] += clock() - t2
                timing["pass_s"] += t1 - t0
                left -= n
            if not keep:
                return
            os.close(fd)
            fd = -1
            if digest.hexdigest() != sha:
                if source is not self.source:  # the relay's socket: relay.py is loaded already
                    from .relay import RelayError
                    raise RelayError("content of %s arrived corrupted from the upstream host" % sha)
                raise Fail("content of %s arrived corrupted" % sha, "corrupt")
            os.replace(tmp, final)
            timing["last"] = time.time()
            self.created.append(final)  # noted in the index once linked (build_tree)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            if tmp is not None:
                os.unlink(tmp)
            raise

    def build_tree(self, manifest, files):
        """RUN_DIR/job: the folders, a hard link per file into the cache, and the symlinks (last, each
        checked: no symlink among its ancestors, and it must resolve inside the job)."""
        os.mkdir(os.path.join(self.run_dir, "job"), 0o700)
        job = os.path.realpath(os.path.join(self.run_dir, "job"))
        self._folders.add(job)
        for rel in manifest.get("dirs", []):
            self.folder(os.path.join(job, safe_rel(rel)))
        linked = {}
        for rel, sha, _, exe in files:
            dest = os.path.join(job, safe_rel(rel))
            self.current = dest
            self.folder(os.path.dirname(dest))
            src = linked[(sha, bool(exe))] = object_path(self.cache, sha, exe)
            try:
                os.link(src, dest)
            except OSError:
                import shutil

                shutil.copy2(src, dest)  # another file system, or too many links
        for (sha, exe), src in linked.items():  # checked (or received) just now; a link changes the ctime
            self.index.note(sha, exe, os.stat(src), later=True)
        made = []
        for rel, target in manifest.get("symlinks", []):
            dest = os.path.join(job, safe_rel(rel))
            parent = os.path.dirname(dest)
            if os.path.realpath(parent) != parent:  # a symlink among its ancestors: it would lead elsewhere
                raise Fail("symlink %s lies under another symlink" % rel, "protocol", rel)
            resolved = os.path.normpath(os.path.join(parent, target))
            if target.startswith("/") or not resolved.startswith(job + os.sep):
                raise Fail("symlink %s points out of the job (%s)" % (rel, target), "protocol", rel)
            os.makedirs(parent, 0o700, exist_ok=True)
            os.symlink(target, dest)
            made.append((rel, dest))
        # only now, with every link in place: a link made early may pass through one made later
        for rel, dest in made:
            real = os.path.realpath(dest)
            if real != job and not real.startswith(job + os.sep):
                raise Fail("symlink %s resolves out of the job (%s)" % (rel, real), "protocol", rel)

    def undo(self):
        """Nothing has started: leave no partial run behind, and give the space back (the disk may be full)."""
        if self.made_run_dir:
            import shutil

            shutil.rmtree(self.run_dir, ignore_errors=True)
        for path in self.created:
            try:
                os.unlink(path)
            except OSError:
                pass

    def drain(self, left):
        """Read (and drop) what the controller still sends."""
        while left > 0:
            n = self.stdin.readinto(self.buf[:min(left, len(self.buf))])
            if not n:
                break
            left -= n

    def answer(self, exc):
        if isinstance(exc, OSError):
            kind = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "os"
            exc = Fail(os.strerror(exc.errno) if exc.errno else str(exc), kind, self.current)
        return {"error": str(exc), "kind": exc.kind, "path": exc.path}
