"""clusterrun's host side: one stdlib-only file, pushed to each host and run with the host's Python.

Usage (by the controller, never by hand): supervisor.py WORKDIR COMMAND [ARGS...]

  sync RUN_DIR          receive the job by content hash into RUN_DIR/job (framed stdin/stdout); when
                        asked, hold the channel and start the run on a later message
  start RUN_DIR         write the spec (0600) from stdin, fork a detached supervisor (it runs the ranks in
                        their own process groups, records exits, forwards stops), print its state
  follow RUN_DIR OFFS   stream log bytes from offsets, exit records and heartbeats as frames on stdout
  status RUN_DIR        print the run's state on this host as JSON
  stop RUN_DIR GRACE    TERM the ranks' process groups, wait GRACE, KILL; idempotent
  cat RUN_DIR PATH      print a file of the run's job folder (results such as metrics.json)
  free-port             print a TCP port that is free on this host
  probe                 print facts about this host as JSON

A rank's life never depends on the SSH channel: ranks run under a supervisor in its own session, write
to log files here, and every state change is a file written atomically. Processes are only ever
signalled by recorded pid/process group after checking they are still the ones we started (start time,
or the run id in their environment) - never by name.
"""

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

PROTOCOL = 1
FRAME = struct.Struct(">cIQI")  # type, rank, offset, payload length
CHUNK = 1 << 20
IDLE_SLEEP = 0.02
HEARTBEAT_EVERY = 1.0
CAT_LIMIT = 64 << 20


class Fail(Exception):
    """An expected failure, reported to the controller as JSON {"error", "kind", "path"}."""

    def __init__(self, message, kind="error", path=""):
        Exception.__init__(self, message)
        self.kind = kind
        self.path = path


# ---------------------------------------------------------------- small helpers


def write_json_atomic(path, obj, exclusive=False):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    if exclusive:
        try:
            os.link(tmp, path)  # fails if another writer got there first
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
        finally:
            os.unlink(tmp)
    else:
        os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def start_ticks(pid):
    """Process start time in clock ticks since boot (None if gone or no /proc): tells pid reuse apart."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def same_process(pid, ticks):
    """True if pid is alive and is the process recorded with these start ticks."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    now = start_ticks(pid)
    if now is None or ticks is None:
        return not os.path.exists("/proc/self/stat")  # no /proc: best effort on the pid alone
    return now == ticks


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def run_members(run_id):
    """Pids of this user's processes whose environment carries this run's id (catches setsid escapees)."""
    marker = ("CLUSTERRUN_RUN_ID=%s" % run_id).encode()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def signal_rank(run_id, info, sig):
    """Signal one rank's process group, if it is still ours; else its leftover members by run id."""
    pgid = info.get("pgid")
    if same_process(info.get("pid"), info.get("ticks")):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        return
    for pid in run_members(run_id):
        try:
            if os.getpgid(pid) == pgid:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def rank_live(run_id, info):
    if same_process(info.get("pid"), info.get("ticks")):
        return True
    pgid = info.get("pgid")
    for pid in run_members(run_id):
        try:
            if os.getpgid(pid) == pgid:
                return True
        except ProcessLookupError:
            pass
    return False


def exit_path(run_dir, rank):
    return os.path.join(run_dir, "rank-%d.exit" % rank)


def log_path(run_dir, rank):
    return os.path.join(run_dir, "rank-%d.log" % rank)


# ---------------------------------------------------------------- sync


def read_exact(stream, n):
    parts = []
    while n:
        chunk = stream.read(min(n, CHUNK))
        if not chunk:
            raise Fail("the controller went away during the push", "aborted")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_msg(stream):
    (n,) = struct.unpack(">I", read_exact(stream, 4))
    return json.loads(read_exact(stream, n).decode())


def send_msg(obj):
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(data)) + data)
    sys.stdout.buffer.flush()


def safe_rel(path):
    parts = path.split("/")
    if not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise Fail("unsafe path in manifest: %r" % path, "protocol")
    return os.path.join(*parts)


def object_path(cache, sha, executable):
    return os.path.join(cache, sha[:2], sha + ("-x" if executable else ""))


def cmd_sync(workdir, run_dir):
    """Receive objects the host's content cache lacks, then build RUN_DIR/job from hard links."""
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
    except FileExistsError:
        send_msg({"missing": [], "error": "run folder already exists", "kind": "exists", "path": run_dir})
        return 1
    send_msg({"missing": [sha for sha, _, _ in missing], "port": free_port() if manifest.get("free_port") else None})
    received = 0  # bytes of objects read from the controller so far
    current = ""
    created = []  # objects this push added to the cache: removed again if the push fails
    try:
        for sha, size, exe in missing:
            final = object_path(cache, sha, exe)
            current = final
            os.makedirs(os.path.dirname(final), 0o700, exist_ok=True)
            tmp = "%s.tmp-%d" % (final, os.getpid())
            digest = hashlib.sha256()
            try:
                with open(tmp, "wb") as out:
                    left = size
                    while left:
                        chunk = stdin.read(min(left, CHUNK))
                        if not chunk:
                            raise Fail("the controller went away during the push", "aborted")
                        received += len(chunk)
                        digest.update(chunk)
                        out.write(chunk)
                        left -= len(chunk)
                if digest.hexdigest() != sha:
                    raise Fail("content of %s arrived corrupted" % sha, "corrupt")
                os.chmod(tmp, 0o555 if exe else 0o444)
                os.replace(tmp, final)
                created.append(final)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        job = os.path.join(run_dir, "job")
        os.mkdir(job, 0o700)
        for rel in manifest.get("dirs", []):
            os.makedirs(os.path.join(job, safe_rel(rel)), 0o700, exist_ok=True)
        for rel, sha, _, exe in files:
            dest = os.path.join(job, safe_rel(rel))
            current = dest
            os.makedirs(os.path.dirname(dest), 0o700, exist_ok=True)
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


# ---------------------------------------------------------------- start and supervise


def cmd_start(run_dir):
    reply(start_run(run_dir, json.loads(sys.stdin.buffer.read().decode())))
    return 0


def start_run(run_dir, spec):
    """Write the spec (0600), fork the detached supervisor, and return its state once the ranks run."""
    if not os.path.isdir(os.path.join(run_dir, "job")):
        raise Fail("the job was not pushed to this host", "missing", run_dir)
    if os.path.exists(os.path.join(run_dir, "spec.json")):
        raise Fail("this run was already started on this host", "exists", run_dir)
    write_json_atomic(os.path.join(run_dir, "spec.json"), spec)
    sys.stdout.flush()
    pid = os.fork()  # the supervisor is this process's twin: no second interpreter start-up
    if pid == 0:
        code = 1
        try:
            os.setsid()  # its own session: the SSH channel closing (SIGHUP, EOF) never reaches it
            os.chdir(run_dir)
            log = os.open(os.path.join(run_dir, "supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(null)
            os.close(log)
            code = cmd_supervise(run_dir)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.time() + 30
    state_file = os.path.join(run_dir, "state.json")
    while time.time() < deadline:
        state = read_json(state_file)
        if state is not None:
            return state
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            break
        time.sleep(0.002)
    with open(os.path.join(run_dir, "supervisor.log"), "rb") as fh:
        tail = fh.read()[-2000:].decode("utf-8", "replace")
    raise Fail("the supervisor did not start: " + (tail or "no output"), "start")


def cmd_supervise(run_dir):
    os.umask(0o077)
    spec = read_json(os.path.join(run_dir, "spec.json"))
    run_id = spec["run_id"]
    grace = float(spec.get("grace", 10))
    requested = []

    def on_signal(signum, frame):
        requested.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    procs, ranks, exits = {}, {}, {}
    stopped_early = os.path.exists(os.path.join(run_dir, "stop.json"))
    for r in spec["ranks"]:
        rank = r["rank"]
        if stopped_early:  # stopped between start and now: start nothing, record why
            exits[rank] = {"rank": rank, "exit_code": None, "signal": None, "ended_at": time.time(),
                           "started_at": None, "stopped": True, "error": "stopped before it started"}
            write_json_atomic(exit_path(run_dir, rank), exits[rank])
            continue
        env = dict(os.environ)
        env.update(r["env"])
        fd = os.open(log_path(run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(r["argv"], cwd=os.path.join(run_dir, "job"), env=env, stdin=subprocess.DEVNULL,
                                    stdout=fd, stderr=fd, start_new_session=True, close_fds=True)
        except OSError as exc:
            os.write(fd, ("clusterrun: cannot start rank %d (%s): %s\n" % (rank, r["argv"][0], exc)).encode())
            exits[rank] = {"rank": rank, "exit_code": 127, "signal": None, "ended_at": time.time(),
                           "started_at": time.time(), "stopped": False, "error": str(exc)}
            write_json_atomic(exit_path(run_dir, rank), exits[rank])
            continue
        finally:
            os.close(fd)
        procs[rank] = proc
        ranks[str(rank)] = {"pid": proc.pid, "pgid": proc.pid, "ticks": start_ticks(proc.pid),
                            "started_at": time.time()}
    write_json_atomic(os.path.join(run_dir, "state.json"),
                      {"protocol": PROTOCOL, "run_id": run_id, "supervisor": {"pid": os.getpid(),
                       "ticks": start_ticks(os.getpid())}, "ranks": ranks, "started_at": time.time()})
    stopping_since = None
    stop_grace = grace
    stopped = set()
    cleanup = {}  # pgid -> deadline: members left behind by a rank that exited
    while procs or cleanup:
        now = time.time()
        for rank, proc in list(procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del procs[rank]
            exits[rank] = {"rank": rank, "exit_code": rc if rc >= 0 else None, "signal": -rc if rc < 0 else None,
                           "ended_at": now, "started_at": ranks[str(rank)]["started_at"],
                           "stopped": rank in stopped}
            write_json_atomic(exit_path(run_dir, rank), exits[rank])
            if group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGTERM)
                cleanup[proc.pid] = now + 2.0
        for pgid, deadline in list(cleanup.items()):
            if not group_alive(pgid):
                del cleanup[pgid]
            elif now > deadline:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                del cleanup[pgid]
        failed = any(e["exit_code"] != 0 and not e["stopped"] for e in exits.values())
        stop_file = read_json(os.path.join(run_dir, "stop.json")) if requested or stopping_since is None else None
        if stopping_since is None and (requested or stop_file or (failed and spec.get("fail_fast", True))):
            stopping_since = now
            if stop_file:
                stop_grace = float(stop_file.get("grace", grace))
            for rank, proc in procs.items():
                stopped.add(rank)
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        elif stopping_since is not None and now - stopping_since >= stop_grace:
            for rank, proc in procs.items():
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        time.sleep(0.05)
    write_json_atomic(os.path.join(run_dir, "done.json"), {"ended_at": time.time()})
    return 0


# ---------------------------------------------------------------- status, follow, stop


def load_state(run_dir, must_exist=True):
    """(spec, state); (None, None) for a run that was pushed (or not even that) but never started."""
    state = read_json(os.path.join(run_dir, "state.json"))
    spec = read_json(os.path.join(run_dir, "spec.json"))
    if spec is None:
        if os.path.isdir(run_dir) or not must_exist:
            return None, None
        raise Fail("no such run on this host", "missing", run_dir)
    return spec, state


def settle(run_dir, spec, state, check_lost=True):
    """Exit records by rank; with check_lost, make up 'lost' ones for ranks gone without a record.

    A rank is lost when its supervisor is gone and so is the rank: nobody is left to record its exit.
    """
    exits = {}
    sup = (state or {}).get("supervisor", {})
    sup_alive = same_process(sup.get("pid"), sup.get("ticks"))
    if state is None:
        try:  # the supervisor may be about to write its state; give it time before calling anything lost
            check_lost = check_lost and time.time() - os.path.getmtime(os.path.join(run_dir, "spec.json")) > 30
        except OSError:
            check_lost = False
    for r in spec["ranks"]:
        rank = r["rank"]
        rec = read_json(exit_path(run_dir, rank))
        if rec is None and check_lost and not sup_alive:
            info = (state or {}).get("ranks", {}).get(str(rank))
            if info is None or not rank_live(spec["run_id"], info):
                rec = {"rank": rank, "exit_code": None, "signal": None, "ended_at": time.time(), "stopped": False,
                       "lost": True, "error": "the supervisor on this host is gone; exit status unknown"}
                write_json_atomic(exit_path(run_dir, rank), rec, exclusive=True)
                rec = read_json(exit_path(run_dir, rank))
        if rec is not None:
            exits[rank] = rec
    return exits, sup_alive


def cmd_status(run_dir):
    spec, state = load_state(run_dir, must_exist=False)
    if spec is None:
        reply({"run_dir": run_dir, "started": False, "ranks": {}})
        return 0
    exits, sup_alive = settle(run_dir, spec, state)
    ranks = {}
    for r in spec["ranks"]:
        rank = r["rank"]
        try:
            size = os.path.getsize(log_path(run_dir, rank))
        except OSError:
            size = 0
        ranks[str(rank)] = {"exit": exits.get(rank), "log_size": size,
                            "pid": (state or {}).get("ranks", {}).get(str(rank), {}).get("pid")}
    reply({"run_dir": run_dir, "started": True, "supervisor_alive": sup_alive, "now": time.time(),
           "done": len(exits) == len(spec["ranks"]), "ranks": ranks})
    return 0


def emit(kind, rank, offset, payload):
    out = sys.stdout.buffer
    out.write(FRAME.pack(kind, rank, offset, len(payload)))
    out.write(payload)


def cmd_follow(run_dir, offsets_json, once=False):
    """Frames: L log bytes, X exit record, H heartbeat, E end. Exits are sent only after their log is drained."""
    offsets = {int(k): int(v) for k, v in json.loads(offsets_json).items()}
    spec, state = load_state(run_dir)
    if spec is None:
        raise Fail("the run was not started on this host", "missing", run_dir)
    ranks = [r["rank"] for r in spec["ranks"]]
    handles, sent_exit, exits = {}, set(), {}
    last_beat = last_settle = 0.0
    sup_alive = True
    while True:
        progressed = False
        now = time.time()
        if now - last_settle >= HEARTBEAT_EVERY or once:
            # the expensive part (is the supervisor alive? are ranks lost?) once a second
            exits, sup_alive = settle(run_dir, spec, state)
            last_settle = now
        else:
            for rank in ranks:
                if rank not in exits and os.path.exists(exit_path(run_dir, rank)):
                    rec = read_json(exit_path(run_dir, rank))
                    if rec is not None:
                        exits[rank] = rec
        for rank in ranks:
            if rank not in handles:
                try:
                    handles[rank] = open(log_path(run_dir, rank), "rb")
                except OSError:
                    continue
            fh = handles[rank]
            offset = offsets.get(rank, 0)
            if os.fstat(fh.fileno()).st_size > offset:
                fh.seek(offset)
                while True:
                    data = fh.read(CHUNK)
                    if not data:
                        break
                    emit(b"L", rank, offset, data)
                    offset += len(data)
                    progressed = True
                    if len(data) < CHUNK:
                        break
                offsets[rank] = offset
            if rank in exits and rank not in sent_exit and os.fstat(fh.fileno()).st_size == offset:
                emit(b"X", rank, offset, json.dumps(exits[rank]).encode())
                sent_exit.add(rank)
                progressed = True
        for rank in ranks:  # a rank that never got a log file (could not start) still has an exit
            if rank not in handles and rank in exits and rank not in sent_exit:
                emit(b"X", rank, 0, json.dumps(exits[rank]).encode())
                sent_exit.add(rank)
                progressed = True
        if now - last_beat >= HEARTBEAT_EVERY:
            emit(b"H", 0, 0, json.dumps({"now": now, "supervisor_alive": sup_alive}).encode())
            last_beat = now
            progressed = True
        if progressed:
            sys.stdout.buffer.flush()
        if len(sent_exit) == len(ranks) or once:
            emit(b"E", 0, 0, b"{}")
            sys.stdout.buffer.flush()
            return 0
        if state is None:
            state = read_json(os.path.join(run_dir, "state.json"))
        if not progressed:
            time.sleep(IDLE_SLEEP)


def cmd_stop(run_dir, grace):
    spec, state = load_state(run_dir, must_exist=False)
    if spec is None:  # pushed (or partly) but never started: nothing runs, so the files go too
        removed = os.path.isdir(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        reply({"exits": {}, "left": [], "note": "never started" + ("; pushed files removed" if removed else "")})
        return 0
    run_id = spec["run_id"]
    write_json_atomic(os.path.join(run_dir, "stop.json"), {"grace": grace, "requested_at": time.time()})
    waited = time.time() + 5.0
    while state is None and time.time() < waited:  # a supervisor starting right now reads stop.json first
        time.sleep(0.02)
        state = read_json(os.path.join(run_dir, "state.json"))
    exits, sup_alive = settle(run_dir, spec, state)
    sup = (state or {}).get("supervisor", {})
    infos = (state or {}).get("ranks", {})
    pending = [r["rank"] for r in spec["ranks"] if r["rank"] not in exits]
    if pending:
        if sup_alive:
            os.kill(sup["pid"], signal.SIGTERM)
        else:
            for rank in pending:
                signal_rank(run_id, infos.get(str(rank), {}), signal.SIGTERM)
    deadline = time.time() + grace
    killed = False
    while True:
        live = [r for r in pending if rank_live(run_id, infos.get(str(r), {}))]
        if not live:
            break
        if time.time() >= deadline and not killed:
            for rank in live:
                signal_rank(run_id, infos.get(str(rank), {}), signal.SIGKILL)
            killed = True
        elif killed and time.time() >= deadline + 5:
            break
        time.sleep(0.02)
    for pid in run_members(run_id):  # anything of this run that left its process group
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    waited = time.time() + 2.0
    while time.time() < waited:  # let the supervisor (if any) write the exit records
        exits, _ = settle(run_dir, spec, state)
        if len(exits) == len(spec["ranks"]) or not same_process(sup.get("pid"), sup.get("ticks")):
            break
        time.sleep(0.02)
    exits, sup_alive = settle(run_dir, spec, state)
    reply({"exits": {str(k): v for k, v in exits.items()}, "killed": killed,
           "left": [r for r in pending if rank_live(run_id, infos.get(str(r), {}))]})
    return 0


def cmd_cat(run_dir, rel):
    """A file of the run's job folder (metrics.json, say), raw on stdout; never anything outside it."""
    job = os.path.realpath(os.path.join(run_dir, "job"))
    path = os.path.realpath(os.path.join(job, rel))
    if not path.startswith(job + os.sep):
        raise Fail("%r is outside the run's job folder" % rel, "protocol")
    try:
        with open(path, "rb") as fh:
            data = fh.read(CAT_LIMIT + 1)
    except OSError as exc:
        raise Fail("cannot read %s: %s" % (rel, exc.strerror), "missing", path)
    if len(data) > CAT_LIMIT:
        raise Fail("%s is larger than %d bytes" % (rel, CAT_LIMIT), "too_big", path)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


def free_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def cmd_free_port():
    reply({"port": free_port()})
    return 0


def cmd_probe(workdir):
    import platform
    usage = shutil.disk_usage(workdir if os.path.isdir(workdir) else os.path.dirname(workdir) or "/")
    reply({"python": platform.python_version(), "executable": sys.executable, "hostname": socket.gethostname(),
           "time": time.time(), "disk_free": usage.free, "platform": sys.platform})
    return 0


def main(argv):
    os.umask(0o077)
    workdir, command, args = os.path.expanduser(argv[1]), argv[2], argv[3:]
    os.makedirs(workdir, 0o700, exist_ok=True)

    def run_dir():
        path = os.path.normpath(os.path.join(workdir, "runs", args[0]))
        if os.path.dirname(path) != os.path.join(workdir, "runs"):
            raise Fail("bad run id %r" % args[0], "protocol")
        return path

    try:
        if command == "sync":
            return cmd_sync(workdir, run_dir())
        if command == "start":
            return cmd_start(run_dir())
        if command == "follow":
            return cmd_follow(run_dir(), args[1], once="--once" in args[2:])
        if command == "status":
            return cmd_status(run_dir())
        if command == "stop":
            return cmd_stop(run_dir(), float(args[1]))
        if command == "cat":
            return cmd_cat(run_dir(), args[1])
        if command == "free-port":
            return cmd_free_port()
        if command == "probe":
            return cmd_probe(workdir)
        raise Fail("unknown command %r" % command, "protocol")
    except Fail as exc:
        answer = {"error": str(exc), "kind": exc.kind, "path": exc.path}
        send_msg(answer) if command == "sync" else reply(answer)  # sync speaks framed messages
        return 1
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
