"""Start a run: write its spec (0600), fork a supervisor into its own session, and supervise the
ranks: each in its own process group, exits recorded atomically, stops forwarded TERM → grace → KILL."""

import json
import os
import signal
import subprocess
import sys
import time

from .common import PROTOCOL, Fail, exit_path, log_path, read_json, reply, write_json_atomic
from .procs import group_alive, start_ticks



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
