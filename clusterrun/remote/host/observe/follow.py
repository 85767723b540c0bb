"""Follow a run: log bytes from given offsets, exit records and heartbeats, as frames on stdout.

Frames (wire.FRAME: kind, rank, offset, payload length; then the payload):
  L  log bytes of a rank, from its byte offset       X  a rank's exit record (JSON), after its log is drained
  A  log bytes of an auxiliary stream (rank field: its index in AUX, e.g. 0 = torchrun's own output)
  H  heartbeat {"now", "supervisor_alive", "restarts", "connecting", "lost": {node rank: why} (rank 0's host:
     the hosts its supervisor's coordinator lost), "rendezvous": [findings] (run/rendezvous.py)} each second (and RUN/followed touched: a controller
     follows the run, observe/state.py)
  E  the end: every rank's exit was sent (under torchrun, also once its supervisor is done)
  F  instead of any of these: a failure {"error", "kind", "path"} (main.py); kind "missing": no such run
     here (its folder is gone: clean, retention, a push that failed) or it never started here
Offsets come as JSON {"<rank>": bytes, "a<index>": bytes}. Under torchrun the ranks of this host are
learnt as its workers register (state.rank_ids), so frames may name ranks the controller did not
expect here; they are always below the world size.
"""

import os
import select
import sys
import time

from ..stdlib import json
from ..files import open_regular, read_json
from ..paths import exit_path, log_path
from .state import collect_exits, load_state, mark_followed, rank_ids, supervisor_done
from ..secrets import Masker, secret_values
from ..wire import CHUNK, FRAME, Fail
from .connecting import connecting

IDLE_SLEEP = 0.02
HEARTBEAT_EVERY = 1.0

AUX = ("launcher.log",)  # auxiliary streams, by index
SEND_AT_ONCE = 4 * CHUNK  # read per file per round, then sent in CHUNK-sized frames
STUCK_AFTER = 8.0  # a rank connecting this long without an answer is reported (the rendezvous watchdog)
STUCK_FORGET = 5.0
# Reading /proc/net/tcp walks the kernel's whole connection table (milliseconds on a big host): not in a
# run's first seconds, when no rank can have been connecting for STUCK_AFTER yet
STUCK_FROM = 2.0


def emit(kind, rank, offset, payload):
    out = sys.stdout.buffer
    out.write(FRAME.pack(kind, rank, offset, len(payload)))
    out.write(payload)


def cmd_follow(run_dir, offsets_json, *flags):
    once = "--once" in flags
    spec, state = load_state(run_dir)
    if spec is None:
        raise Fail("the run was not started on this host", "missing", run_dir)
    return Follow(run_dir, spec, state, parse_offsets(json.loads(offsets_json)), once).run()


def parse_offsets(raw):
    """{"<rank>": bytes, "a<index>": bytes} as {rank: bytes, ("a", index): bytes}."""
    offsets = {int(k): int(v) for k, v in raw.items() if not k.startswith("a")}
    offsets.update({("a", int(k[1:])): int(v) for k, v in raw.items() if k.startswith("a")})
    return offsets


class Follow:
    def __init__(self, run_dir, spec, state, offsets, once, wake=None):
        """wake: (the read end of the pipe the supervisor writes to at every exit record, its pid), when this
        process started it (push/held.py): an exit is sent the moment it is recorded, not a nap later."""
        self.run_dir, self.spec, self.state, self.offsets, self.once = run_dir, spec, state, offsets, once
        self.wake, self.supervisor = wake if wake is not None else (None, None)
        self.dynamic = spec.get("launcher") == "torchrun"
        self.ranks = rank_ids(spec, state)
        self.aux = [("a", i) for i in range(len(AUX))] if self.dynamic else []
        self.handles, self.sent_exit, self.exits = {}, set(), {}
        self.masker = Masker(secret_values(spec))  # secrets never leave this host (secrets.py)
        self.stuck_since = {}  # (rank, remote) -> (first, last) time it was seen connecting
        self.last_beat = self.last_collect = 0.0
        self.sup_alive = True

    def run(self):
        while True:
            now = time.time()
            self.refresh_exits(now)
            progressed = False
            for key in self.aux:
                progressed = self.send_log(key, os.path.join(self.run_dir, AUX[key[1]]), b"A", key[1],
                                           final=not self.sup_alive or supervisor_done(self.run_dir)) or progressed
            for rank in self.ranks:
                progressed = self.send_rank(rank) or progressed
            if now - self.last_beat >= HEARTBEAT_EVERY:
                self.beat(now)
                progressed = True
            if progressed:
                sys.stdout.buffer.flush()
            if self.finished() or self.once:
                emit(b"E", 0, 0, b"{}")
                sys.stdout.buffer.flush()
                return 0
            if self.state is None:
                self.state = read_json(os.path.join(self.run_dir, "state.json"))
            if not progressed:
                self.idle()

    def beat(self, now):
        """The heartbeat: this host's clock, torchrun's restarts, ranks stuck connecting, and the hosts rank
        0's supervisor lost (state.json's "mesh", read again each time)."""
        self.state = read_json(os.path.join(self.run_dir, "state.json")) or self.state
        state = self.state or {}
        emit(b"H", 0, 0, json.dumps({"now": now, "supervisor_alive": self.sup_alive, "restarts": state.get("restarts", 0),
                                     "connecting": self.stuck(now), "rendezvous": state.get("rendezvous") or [],
                                     "lost": (state.get("mesh") or {}).get("lost") or {}}).encode())
        self.last_beat = now
        if not self.once:  # a controller watches: the supervisors' mesh may lean on it (run/supervisor.py)
            mark_followed(self.run_dir)

    def idle(self):
        """Nap until there may be more to send: IDLE_SLEEP, or less when the supervisor wrote an exit record."""
        if self.wake is None:
            time.sleep(IDLE_SLEEP)
            return
        if select.select([self.wake], [], [], IDLE_SLEEP)[0] and not os.read(self.wake, 4096):
            os.close(self.wake)  # the supervisor ended (this process is its parent: reap it)
            self.wake = None
            try:
                os.waitpid(self.supervisor, 0)
            except (ChildProcessError, TypeError):
                pass

    def stuck(self, now):
        """[{rank, remote, seconds}] for ranks that have been connecting without an answer for a while."""
        if now - ((self.state or {}).get("started_at") or now) < STUCK_FROM:
            return []
        for rank, pid in self._watched():
            for remote in connecting([pid]) if pid else ():
                since, _ = self.stuck_since.get((rank, remote), (now, now))
                self.stuck_since[(rank, remote)] = (since, now)
        # a process that retries its connect shows a new socket each time, not always in SYN-SENT when we
        # look: forget an address only once it has not been seen connecting for a while
        self.stuck_since = {k: v for k, v in self.stuck_since.items() if now - v[1] < STUCK_FORGET}
        return [{"rank": rank if rank >= 0 else None, "remote": remote, "seconds": round(now - since, 1)}
                for (rank, remote), (since, last) in sorted(self.stuck_since.items())
                if last == now and now - since >= STUCK_AFTER]

    def _watched(self):
        """(rank, pid) of every rank that has not exited, and (-1, pid) of torchrun's own rendezvous."""
        state = self.state or {}
        watched = [(int(rank), info.get("pid")) for rank, info in (state.get("ranks") or {}).items()
                   if int(rank) not in self.exits]
        if (state.get("launcher") or {}).get("pid"):
            watched.append((-1, state["launcher"]["pid"]))
        return watched

    def finished(self):
        if any(rank not in self.sent_exit for rank in self.ranks):
            return False
        return not self.dynamic or not self.sup_alive or supervisor_done(self.run_dir)

    def refresh_exits(self, now):
        if now - self.last_collect >= HEARTBEAT_EVERY or self.once:
            # the expensive part (is the supervisor alive? are ranks lost?) once a second
            if self.dynamic:
                self.state = read_json(os.path.join(self.run_dir, "state.json")) or self.state
                self.ranks = rank_ids(self.spec, self.state)
            self.exits, self.sup_alive = collect_exits(self.run_dir, self.spec, self.state)
            self.last_collect = now
            return
        for rank in self.ranks:
            if rank not in self.exits and os.path.exists(exit_path(self.run_dir, rank)):
                rec = read_json(exit_path(self.run_dir, rank))
                if rec is not None:
                    self.exits[rank] = rec

    def send_log(self, key, path, kind, number, final=True):
        """New bytes of one log file, from its offset, secrets masked; True if anything was sent. Unless the
        file is final, bytes that may begin a secret wait for what follows them."""
        fh = self.handles.get(key)
        if fh is None:
            try:
                # the rank can write its folder: a FIFO or a symlink put in its log's place is not followed
                fh = self.handles[key] = os.fdopen(open_regular(path), "rb")
            except OSError:
                return False
        offset = self.offsets.get(key, 0)
        if os.fstat(fh.fileno()).st_size <= offset:
            return False
        fh.seek(offset)
        data = fh.read(SEND_AT_ONCE)
        if self.masker:
            more = os.fstat(fh.fileno()).st_size > offset + len(data)
            data = self.masker.mask(data)
            if more or not final:
                data = data[:len(data) - self.masker.holdback(data)]
        for start in range(0, len(data), CHUNK):
            part = data[start:start + CHUNK]
            emit(kind, number, offset, part)
            offset += len(part)
        self.offsets[key] = offset
        return bool(data)

    def send_rank(self, rank):
        """New log bytes of one rank, then its exit once the log is drained; True if anything was sent."""
        sent = self.send_log(rank, log_path(self.run_dir, rank), b"L", rank, final=rank in self.exits)
        fh = self.handles.get(rank)
        if fh is None:  # no log file (it could not start): its exit still goes out
            return self.send_exit(rank, 0) or sent
        offset = self.offsets.get(rank, 0)
        if os.fstat(fh.fileno()).st_size == offset:
            sent = self.send_exit(rank, offset) or sent
        return sent

    def send_exit(self, rank, offset):
        if rank not in self.exits or rank in self.sent_exit:
            return False
        emit(b"X", rank, offset, json.dumps(self.masker.mask_record(self.exits[rank])).encode())
        self.sent_exit.add(rank)
        return True
