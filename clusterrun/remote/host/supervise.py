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
    return Supervisor(run_dir).run()


class Supervisor:
    """The ranks of one run on this host: started in their own process groups, exits recorded atomically,
    a stop (signal or stop.json) forwarded TERM → grace → KILL, leftovers of an exited rank cleaned up."""

    def __init__(self, run_dir):
        os.umask(0o077)
        self.run_dir = run_dir
        self.spec = read_json(os.path.join(run_dir, "spec.json"))
        self.grace = float(self.spec.get("grace", 10))
        self.requested = []  # signals received
        self.procs, self.ranks, self.exits = {}, {}, {}
        self.stopped = set()  # ranks clusterrun stopped
        self.stopping_since = None
        self.cleanup = {}  # pgid -> deadline: members left behind by a rank that exited

    def run(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.requested.append(signum))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.start_ranks()
        write_json_atomic(os.path.join(self.run_dir, "state.json"),
                          {"protocol": PROTOCOL, "run_id": self.spec["run_id"],
                           "supervisor": {"pid": os.getpid(), "ticks": start_ticks(os.getpid())},
                           "ranks": self.ranks, "started_at": time.time()})
        while self.procs or self.cleanup:
            now = time.time()
            self.record_exits(now)
            self.reap_leftovers(now)
            self.forward_stop(now)
            time.sleep(0.05)
        write_json_atomic(os.path.join(self.run_dir, "done.json"), {"ended_at": time.time()})
        return 0

    def record(self, rank, **fields):
        self.exits[rank] = dict({"rank": rank, "exit_code": None, "signal": None, "ended_at": time.time(),
                                 "started_at": None, "stopped": False}, **fields)
        write_json_atomic(exit_path(self.run_dir, rank), self.exits[rank])

    def start_ranks(self):
        stopped_early = os.path.exists(os.path.join(self.run_dir, "stop.json"))
        for r in self.spec["ranks"]:
            rank = r["rank"]
            if stopped_early:  # stopped between start and now: start nothing, record why
                self.record(rank, stopped=True, error="stopped before it started")
                continue
            env = dict(os.environ)
            env.update(r["env"])
            fd = os.open(log_path(self.run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                proc = subprocess.Popen(r["argv"], cwd=os.path.join(self.run_dir, "job"), env=env,
                                        stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                        close_fds=True)
            except OSError as exc:
                os.write(fd, ("clusterrun: cannot start rank %d (%s): %s\n" % (rank, r["argv"][0], exc)).encode())
                self.record(rank, exit_code=127, started_at=time.time(), error=str(exc))
                continue
            finally:
                os.close(fd)
            self.procs[rank] = proc
            self.ranks[str(rank)] = {"pid": proc.pid, "pgid": proc.pid, "ticks": start_ticks(proc.pid),
                                     "started_at": time.time()}

    def record_exits(self, now):
        for rank, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.procs[rank]
            self.record(rank, exit_code=rc if rc >= 0 else None, signal=-rc if rc < 0 else None, ended_at=now,
                        started_at=self.ranks[str(rank)]["started_at"], stopped=rank in self.stopped)
            if group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGTERM)
                self.cleanup[proc.pid] = now + 2.0

    def reap_leftovers(self, now):
        """Processes an exited rank left in its group: TERM at its exit, KILL two seconds later."""
        for pgid, deadline in list(self.cleanup.items()):
            if not group_alive(pgid):
                del self.cleanup[pgid]
            elif now > deadline:
                _killpg(pgid, signal.SIGKILL)
                del self.cleanup[pgid]

    def forward_stop(self, now):
        """On a signal, stop.json or a failed rank (fail_fast): TERM every running rank, KILL after the grace."""
        if self.stopping_since is None:
            failed = any(e["exit_code"] != 0 and not e["stopped"] for e in self.exits.values())
            stop_file = read_json(os.path.join(self.run_dir, "stop.json"))
            if self.requested or stop_file or (failed and self.spec.get("fail_fast", True)):
                self.stopping_since = now
                if stop_file:
                    self.grace = float(stop_file.get("grace", self.grace))
                for rank, proc in self.procs.items():
                    self.stopped.add(rank)
                    _killpg(proc.pid, signal.SIGTERM)
        elif now - self.stopping_since >= self.grace:
            for proc in self.procs.values():
                _killpg(proc.pid, signal.SIGKILL)


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
