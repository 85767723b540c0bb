"""What every launcher's supervisor does on its host (see start.py for how one is started).

Its promises hold with no controller alive: it enforces the run's time limit itself (stop reason
"time-limit", the run ends with exit 4), and with the other hosts' supervisors (peers.py) it stops every
rank on every host after the first failure anywhere, or when a host goes silent, or (job.hang_timeout,
hang.py) when no rank anywhere has written a line for that long. A host that never joined the mesh is
recorded, and counted as lost once no controller follows the run (watch_mesh).
"""

import os
import select
import sys
import time

from ..stdlib import signal
from ..files import read_json, write_json_atomic
from ..paths import exit_path
from . import flight
from ..procs import MARKER_ENV, attempt_key, end_members, group_alive, process_marker, start_ticks
from ..secrets import scrub_run
from ..observe.state import followed_within
from ..wire import PROTOCOL
from .oom import OomWatch
from .rendezvous import RendezvousWatch

# Why a supervisor stopped its ranks (exit records carry it as "stop_reason").
TIME_LIMIT = "time-limit"
FAILED = "failed"  # a rank of this host failed (fail_fast)
STOPPED = "stopped"  # clusterrun stop, Ctrl-C, the controller's teardown
STRAY_GRACE_S = 2.0  # a process that outlived its rank (it left the group): TERM, then KILL after this


class Supervisor:
    """What every launcher's supervisor does: record exits atomically, and forward a stop (a signal,
    stop.json, or with fail_fast a failed rank) as TERM, then KILL after the grace, to every process
    group it started. Subclasses start the processes and say which groups are theirs."""

    TICK = 0.05  # the loop's longest sleep; a child's end (SIGCHLD) or a signal cuts it short

    def __init__(self, run_dir, spec, wake_fd=None):
        os.umask(0o077)
        self.wake_fd = wake_fd  # a follower on the push's channel waits on it: written at every exit record
        self.run_dir = run_dir
        self.spec = spec
        self.grace = float(spec.get("grace", 10))
        self.requested = []  # signals received
        self.ranks, self.exits = {}, {}
        self.stopping_since = None
        self.stop_reason = None
        self.cleanup = {}  # pgid -> deadline: members left behind by a process that exited
        self.started = time.time()
        limit = spec.get("time_limit")  # seconds left of the run's time limit when this host started
        self.deadline = self.started + float(limit) if limit else None
        peers = spec.get("peers") or {}
        self.coordinator = self.peer = None
        if peers.get("coordinator") or peers.get("addr"):  # a run of one host has no mesh (nor its imports)
            from .peers import Coordinator, Peer

            self.coordinator = Coordinator(peers, self.log) if peers.get("coordinator") else None
            self.peer = Peer(peers, int(spec.get("node_rank", 0)), self.log) if peers.get("addr") else None
        self.told_failure = self.told_done = False
        self.mesh_errors = 0
        self.mesh_note = None  # a node that never joined the mesh, as state.json says it (watch_mesh)
        self.hang = None
        if spec.get("hang_timeout"):  # imported here: a run without job.hang_timeout never loads the watch
            from .hang import HangWatch

            self.hang = HangWatch.of(self)
        self.oom = OomWatch()
        self.rendezvous = RendezvousWatch.of(self)

    def environment(self, env):
        """What a process of this run gets: this host's environment, the spec's, the process marker, and a
        checkpoint folder that exists (it outlives attempts: RUN/checkpoints, or job.checkpoint_dir)."""
        out = dict(os.environ)
        out.update(env)
        out[MARKER_ENV] = process_marker(self.spec)
        for name in flight.PATH_ENV:  # the Flight Recorder's files go to the run folder (plan.flight_recorder_env)
            if out.get(name, "").startswith("~"):
                out[name] = os.path.expanduser(out[name])
        folder = out.get("CLUSTERRUN_CHECKPOINT_DIR")
        if folder:
            folder = os.path.expanduser(folder)
            try:
                os.makedirs(folder, 0o700, exist_ok=True)
            except OSError as exc:
                self.log("cannot make the checkpoint folder %s: %s" % (folder, exc))
            out["CLUSTERRUN_CHECKPOINT_DIR"] = folder
        return out

    def log(self, text):
        sys.stdout.write("%s %s\n" % (time.strftime("%H:%M:%S"), text))
        sys.stdout.flush()

    def run(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.requested.append(signum))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        alarm = self.alarm()
        self.start()
        self.write_state()
        while self.running() or self.cleanup or self.serving(time.time()):
            now = time.time()
            self.poll(now)
            self.reap_leftovers(now)
            self.talk(now)
            self.watch_rendezvous(now)
            self.forward_stop(now)
            self.nap(alarm, self.TICK)
        self.talk(time.time())
        strays = end_members(process_marker(self.spec), STRAY_GRACE_S)  # what left its rank's group
        if strays:
            self.log("ended %d process(es) of this run that outlived their rank (pids %s)"
                     % (len(strays), ",".join(map(str, strays))))
        if self.peer is not None:
            self.peer.finish(time.time() + 2.0)
        for side in (self.coordinator, self.peer):
            if side is not None:
                side.close()
        scrub_run(self.run_dir, self.spec)
        write_json_atomic(os.path.join(self.run_dir, "done.json"), {"ended_at": time.time()})
        if (self.spec.get("notify") or {}).get("commands"):
            from . import notify

            notify.at_end(self)  # the run's result is settled: nothing a notify command does can change it
        return 0

    @staticmethod
    def alarm():
        """A pipe the signal machinery writes to on SIGCHLD (a rank ended), TERM or INT: the loop's nap ends
        at once, so a rank's end is recorded (and followed) within a millisecond, not the next tick."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler: else nothing is written
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        return r

    @staticmethod
    def nap(alarm, seconds):
        if select.select([alarm], [], [], seconds)[0]:
            try:
                os.read(alarm, 4096)
            except BlockingIOError:
                pass

    def poke(self):
        """Tell the process that started this supervisor that the state or an exit record was written (the
        start waits for the state; a follower on the push's channel sends an exit the moment it is here)."""
        if self.wake_fd is not None:
            try:
                os.write(self.wake_fd, b"x")
            except BlockingIOError:  # full: there is a byte to wake it already
                pass
            except OSError:  # nobody reads any more (the start returned, or the follower left)
                os.close(self.wake_fd)
                self.wake_fd = None

    def state(self):
        state = {"protocol": PROTOCOL, "attempt_key": attempt_key(self.spec),
                 "supervisor": {"pid": os.getpid(), "ticks": start_ticks(os.getpid())}, "ranks": self.ranks,
                 "started_at": self.started}
        if self.coordinator is not None:
            state["coordinator"] = {"port": self.coordinator.port}
        if self.mesh_note is not None:
            state["mesh"] = self.mesh_note
        if self.rendezvous is not None and self.rendezvous.findings:
            state["rendezvous"] = self.rendezvous.findings
        return state

    def watch_rendezvous(self, now):
        """A rendezvous nobody can join, named (rendezvous.py): supervisor.log and state.json; never fatal."""
        if self.rendezvous is None or self.stopping_since is not None:
            return
        try:
            found = self.rendezvous.tick(now)
        except Exception as exc:  # noqa: BLE001 - a watch that breaks must not take the ranks with it
            self.log("rendezvous watch: %s: %s" % (type(exc).__name__, exc))
            self.rendezvous = None
            return
        for finding in found:
            self.log("rendezvous: " + finding["text"])
        if found:
            self.write_state()

    def serving(self, now):
        """The coordinator stays up while peers it knows of may still run (they would take its going for
        a lost host)."""
        return self.coordinator is not None and self.coordinator.waiting(now)

    def talk(self, now):
        """The peers' side of the promises: report this host's first failure and its end; hear theirs.
        Nothing that happens there may end this supervisor: its ranks, time limit and records go on."""
        try:
            self._talk(now)
        except Exception:
            self.mesh_errors += 1
            if self.mesh_errors <= 5:
                import traceback

                self.log("peer mesh: %s" % traceback.format_exc(limit=4).strip())

    def _talk(self, now):
        if self.coordinator is not None:
            self.coordinator.tick(now)
            if self.stopping_since is not None:
                self.coordinator.stop(self.stop_reason or STOPPED)
            self._note_lost()
        if self.peer is not None:
            self.peer.tick(now)
            failure = self.first_failure()
            if failure is not None and not self.told_failure:
                self.peer.report(failure)  # held until joined when this host failed that early
                self.told_failure = True
            if not self.running() and not self.told_done:
                self.peer.done = True  # said now if joined, else in the hello
                self.told_done = True
        self.watch_mesh(now)

    def watch_mesh(self, now):
        """A node that never joined the mesh by join_timeout is never a silent downgrade (issue 32): it is
        recorded (supervisor.log, state.json "mesh"), and once no controller follows the run, the
        coordinator counts it as a lost host (every host stops) and a peer that never got in stops here."""
        missing = self.coordinator.never_joined(now) if self.coordinator is not None else []
        unreached = self.peer is not None and self.peer.unreached()
        if not missing and not unreached:
            return
        watched = followed_within(self.run_dir, (self.coordinator or self.peer).host_lost)
        self._note_mesh(missing, watched, now)
        if watched:
            return
        if missing:
            self.coordinator.count_lost(missing, "never joined the supervisors' mesh, and no controller follows "
                                                 "the run")
        if unreached and self.peer.stop_reason is None:
            self.peer.stop_reason = ("never reached rank 0's host's coordinator within join_timeout, and no "
                                     "controller follows the run")

    def _note_mesh(self, missing, watched, now):
        """Say it once, and again when a controller stops following: supervisor.log and state.json."""
        if self.mesh_note is not None and self.mesh_note.get("counted_lost") == (not watched):
            return
        what = ("node(s) %s never joined this host's coordinator" % ", ".join(str(n) for n in missing) if missing
                else "this host never got into rank 0's host's coordinator")
        self.log("mesh: %s within join_timeout; %s" % (what, "a controller follows the run: it keeps its "
                 "guarantees" if watched else "no controller follows the run: counted as a lost host"))
        self.mesh_note = dict(self.mesh_note or {}, never_joined=missing or [int(self.spec.get("node_rank", 0))],
                              at=(self.mesh_note or {}).get("at", now), counted_lost=not watched)
        self.write_state()

    def _note_lost(self):
        """The hosts the coordinator lost, in state.json's "mesh" (follow's heartbeat carries them: the
        controller stops waiting for a host whose supervisor is gone as soon as this one knows)."""
        lost = {str(n): why for n, why in sorted(self.coordinator.lost_why.items())}
        if lost and lost != (self.mesh_note or {}).get("lost"):
            self.mesh_note = dict(self.mesh_note or {}, lost=lost)
            self.write_state()

    def write_state(self):
        write_json_atomic(os.path.join(self.run_dir, "state.json"), self.state())
        self.poke()

    def record(self, rank, **fields):
        self.exits[rank] = dict({"rank": rank, "exit_code": None, "signal": None, "ended_at": time.time(),
                                 "started_at": None, "stopped": False}, **fields)
        if self.exits[rank]["stopped"] and self.stop_reason:
            self.exits[rank].setdefault("stop_reason", self.stop_reason)
        if self.hang is not None:  # also a rank that failed once a hung peer was stopped: the run hung first
            self.exits[rank].update(self.hang.exit_fields(rank))
        if self.exits[rank]["signal"] == signal.SIGKILL and not self.exits[rank]["stopped"] \
                and not self.exits[rank].get("error"):  # the OOM killer's? (oom.py)
            torchrun = self.spec.get("launcher") == "torchrun"  # its pid is the shim's, not the worker's
            why = self.oom.cause(None if torchrun else (self.ranks.get(str(rank)) or {}).get("pid"))
            if why:
                self.exits[rank]["error"] = why
        write_json_atomic(exit_path(self.run_dir, rank), self.exits[rank])
        self.poke()

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

    def first_failure(self):
        failed = [e for e in self.exits.values() if e["exit_code"] != 0 and not e["stopped"]]
        if not failed:
            return None
        first = min(failed, key=lambda e: e.get("ended_at") or 0)
        return {"rank": first["rank"], "exit_code": first.get("exit_code"), "signal": first.get("signal")}

    def why_stop(self, now):
        """Why every rank here must stop now, or None: a signal or stop.json (clusterrun), the time limit,
        a failed rank here (fail_fast), or what the other hosts' supervisors found."""
        stop_file = read_json(os.path.join(self.run_dir, "stop.json"))
        if self.requested or stop_file:
            if stop_file:
                self.grace = float(stop_file.get("grace", self.grace))
            return (stop_file or {}).get("reason") or STOPPED
        if self.deadline is not None and now >= self.deadline:
            self.log("time limit reached: stopping")
            return TIME_LIMIT
        if self.first_failure() is not None and self.spec.get("fail_fast", True):
            return FAILED
        return (self.hang.tick(now) if self.hang is not None else None) or self.peers_say()

    def peers_say(self):
        """Why the other hosts' supervisors want every rank stopped, or None."""
        if self.coordinator is not None and self.coordinator.failure:
            self.log("stopping: %s" % self.coordinator.failure)
            return "failed elsewhere: %s" % self.coordinator.failure
        if self.peer is not None and self.peer.stop_reason:
            self.log("stopping: %s" % self.peer.stop_reason)
            return self.peer.stop_reason
        return None

    def forward_stop(self, now):
        """TERM every running group once there is a reason to stop (why_stop), KILL after the grace."""
        if self.stopping_since is None:
            reason = self.why_stop(now)
            if reason is not None:
                self.stopping_since, self.stop_reason = now, reason
                for pgid in self.groups(stopping=True):
                    killpg(pgid, signal.SIGTERM)
        elif now - self.stopping_since >= self.grace:
            for pgid in self.groups(stopping=False):
                killpg(pgid, signal.SIGKILL)

    def running_ranks(self):
        """The ranks here that started and have no exit record yet."""
        return sorted(int(k) for k in self.ranks if int(k) not in self.exits)

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
