"""Start a run: write its spec (0600), fork a supervisor into its own session, which supervises the ranks
(supervisor.py; python_launcher.py or torchrun.py by the job's launcher): each in its own process group,
exits recorded atomically, stops forwarded TERM → grace → KILL. When the spec carries the run's claim on
this host (share/claims.py), the supervisor adopts it before any rank starts and gives it up at its end
(or keeps it for the next attempt after a failure, while attempts remain)."""

import os
import select
import sys
import time

from ..stdlib import json
from ..disk.lock import run_lock
from ..files import read_capped, read_json, regular_size, write_json_atomic
from ..paths import exit_path, job_dir, run_root, stacks_dir
from ..wire import Fail, reply



def cmd_start(run_dir):
    reply(start_run(run_dir, json.loads(sys.stdin.buffer.read().decode())))
    return 0


def start_run(run_dir, spec, wake=None):
    """Write the spec (0600), fork the detached supervisor, and return its state once the ranks run; under
    the run folder's lock, which `clean` takes too (disk/lock.py). wake: a pipe (read end, write end) the
    supervisor writes to at every exit record, for a follower in this process (push/held.py)."""
    lock = run_lock(run_root(run_dir), wait=30.0)
    if lock is None:
        raise Fail("the run folder is gone or stays locked (a `clusterrun clean` on this host?)", "missing",
                   run_dir)
    try:
        return _start_locked(run_dir, spec, lock, wake)
    finally:
        os.close(lock)


def _start_locked(run_dir, spec, lock, wake):
    if not os.path.isdir(job_dir(run_dir)):
        raise Fail("the job was not pushed to this host", "missing", run_dir)
    if run_root(run_dir) != run_dir:  # a restart: its own folder beside the first attempt's files
        try:
            os.mkdir(run_dir, 0o700)
        except FileExistsError:
            raise Fail("attempt %s was already started on this host" % os.path.basename(run_dir), "exists",
                       run_dir) from None
    if os.path.exists(os.path.join(run_dir, "spec.json")):
        raise Fail("this run was already started on this host", "exists", run_dir)
    write_json_atomic(os.path.join(run_dir, "spec.json"), spec)
    os.makedirs(stacks_dir(run_dir), 0o700, exist_ok=True)  # where the ranks' bootstrap dumps (bootstrap.py)
    sys.stdout.flush()
    own = wake is None
    if own:  # the supervisor says when its state is written (what it writes after that goes unread)
        wake = os.pipe()
    pid = os.fork()  # the supervisor is this process's twin: no second interpreter start-up
    if pid == 0:
        code, claim = 1, None
        os.close(lock)  # the lock is this start's, not the run's life long (the next attempt takes it)
        os.close(wake[0])
        os.set_blocking(wake[1], False)  # a follower that stopped reading never holds the supervisor up
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
            claim = _adopt(spec)
            code = supervise(run_dir, wake[1])
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            _give_up(claim, run_dir, spec)
            os._exit(code)
    os.close(wake[1])
    try:
        # ranks started one after another (job.start order rank) take their gaps before the state is written
        waits = float(spec.get("start_gap") or 0) * max(0, len(spec.get("ranks") or []) - 1)
        state = _await_state(run_dir, pid, wake[0], 30 + waits)
    finally:
        if own:
            os.close(wake[0])
    if state is not None:
        return state
    log = os.path.join(run_dir, "supervisor.log")
    try:
        tail = read_capped(log, 2000, max(0, regular_size(log) - 2000)).decode("utf-8", "replace")
    except OSError:
        tail = ""
    raise Fail("the supervisor did not start: " + (tail or "no output"), "start")


def _await_state(run_dir, pid, ready, seconds):
    """The supervisor's state once it has written it (it pokes `ready` then), or None when it ended first."""
    deadline = time.time() + seconds
    state_file = os.path.join(run_dir, "state.json")
    while time.time() < deadline:
        state = read_json(state_file)
        if state is not None:
            return state
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return None
        if select.select([ready], [], [], 0.05)[0] and not os.read(ready, 64):
            time.sleep(0.002)  # the supervisor is ending: the next waitpid tells
    return None


def _adopt(spec):
    """The run's claim on this host, owned by this process (the supervisor) from now on; None without."""
    if not spec.get("claim"):
        return None
    from ..share.claims import adopt

    try:
        adopt(spec["claim"])
    except Fail as exc:  # a restart finds the host taken meanwhile: the start fails, saying by whom
        sys.stdout.write("%s\n" % exc)
        sys.stdout.flush()
        os._exit(1)
    return spec["claim"]


def _give_up(claim, run_dir, spec):
    """At the supervisor's end: the claim goes, or stays for the next attempt after a failure."""
    if claim is None:
        return
    from ..share.claims import at_end

    stop = read_json(os.path.join(run_dir, "stop.json")) or {}
    by_user = stop.get("reason") in ("stopped", "interrupted", "time-limit")
    exits = [read_json(exit_path(run_dir, r["rank"])) or {} for r in spec.get("ranks", [])]
    failed = not by_user and not all(e.get("exit_code") == 0 for e in exits)
    try:
        at_end(claim, failed)
    except OSError:
        pass


def supervise(run_dir, wake_fd=None):
    spec = read_json(os.path.join(run_dir, "spec.json"))
    if spec.get("launcher") == "torchrun":  # imported here, in the supervisor: the push's answer does not wait
        from .torchrun import TorchrunSupervisor as supervisor
    else:
        from .python_launcher import RankSupervisor as supervisor
    return supervisor(run_dir, spec, wake_fd).run()
