"""What every launcher's supervisor does on its host (see supervise.py for how one is started)."""

import os
import signal
import time

from .common import PROTOCOL, exit_path, read_json, write_json_atomic
from .procs import group_alive, start_ticks


class Supervisor:
    """What every launcher's supervisor does: record exits atomically, and forward a stop (a signal,
    stop.json, or with fail_fast a failed rank) as TERM, then KILL after the grace, to every process
    group it started. Subclasses start the processes and say which groups are theirs."""

    def __init__(self, run_dir, spec):
        os.umask(0o077)
        self.run_dir = run_dir
        self.spec = spec
        self.grace = float(spec.get("grace", 10))
        self.requested = []  # signals received
        self.ranks, self.exits = {}, {}
        self.stopping_since = None
        self.cleanup = {}  # pgid -> deadline: members left behind by a process that exited

    def run(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.requested.append(signum))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.start()
        self.write_state()
        while self.running() or self.cleanup:
            now = time.time()
            self.poll(now)
            self.reap_leftovers(now)
            self.forward_stop(now)
            time.sleep(0.05)
        write_json_atomic(os.path.join(self.run_dir, "done.json"), {"ended_at": time.time()})
        return 0

    def state(self):
        return {"protocol": PROTOCOL, "run_id": self.spec["run_id"],
                "supervisor": {"pid": os.getpid(), "ticks": start_ticks(os.getpid())}, "ranks": self.ranks,
                "started_at": time.time()}

    def write_state(self):
        write_json_atomic(os.path.join(self.run_dir, "state.json"), self.state())

    def record(self, rank, **fields):
        self.exits[rank] = dict({"rank": rank, "exit_code": None, "signal": None, "ended_at": time.time(),
                                 "started_at": None, "stopped": False}, **fields)
        write_json_atomic(exit_path(self.run_dir, rank), self.exits[rank])

    def watch_group(self, pgid, now):
        """A process of ours ended: TERM what it left in its group now, KILL it two seconds later."""
        if group_alive(pgid):
            killpg(pgid, signal.SIGTERM)
            self.cleanup[pgid] = now + 2.0

    def reap_leftovers(self, now):
        for pgid, deadline in list(self.cleanup.items()):
            if not group_alive(pgid):
                del self.cleanup[pgid]
            elif now > deadline:
                killpg(pgid, signal.SIGKILL)
                del self.cleanup[pgid]

    def failed(self):
        return any(e["exit_code"] != 0 and not e["stopped"] for e in self.exits.values())

    def forward_stop(self, now):
        """On a signal, stop.json or a failed rank (fail_fast): TERM every running group, KILL after the grace."""
        if self.stopping_since is None:
            stop_file = read_json(os.path.join(self.run_dir, "stop.json"))
            if self.requested or stop_file or (self.failed() and self.spec.get("fail_fast", True)):
                self.stopping_since = now
                if stop_file:
                    self.grace = float(stop_file.get("grace", self.grace))
                for pgid in self.groups(stopping=True):
                    killpg(pgid, signal.SIGTERM)
        elif now - self.stopping_since >= self.grace:
            for pgid in self.groups(stopping=False):
                killpg(pgid, signal.SIGKILL)

    # for subclasses
    def start(self):
        raise NotImplementedError

    def running(self):
        raise NotImplementedError

    def poll(self, now):
        raise NotImplementedError

    def groups(self, stopping):
        """The process groups to signal: the first TERM of a stop (stopping), or the KILL after the grace."""
        raise NotImplementedError


def killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
