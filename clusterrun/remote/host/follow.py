"""Follow a run: log bytes from given offsets, exit records and heartbeats, as frames on stdout.

Frames (common.FRAME: kind, rank, offset, payload length; then the payload):
  L  log bytes of a rank, from its byte offset       X  a rank's exit record (JSON), after its log is drained
  H  heartbeat {"now", "supervisor_alive"} each second      E  the end: every rank's exit was sent
"""

import json
import os
import sys
import time

from .common import CHUNK, FRAME, HEARTBEAT_EVERY, IDLE_SLEEP, Fail, exit_path, log_path, read_json
from .runstate import collect_exits, load_state


def emit(kind, rank, offset, payload):
    out = sys.stdout.buffer
    out.write(FRAME.pack(kind, rank, offset, len(payload)))
    out.write(payload)


def cmd_follow(run_dir, offsets_json, once=False):
    offsets = {int(k): int(v) for k, v in json.loads(offsets_json).items()}
    spec, state = load_state(run_dir)
    if spec is None:
        raise Fail("the run was not started on this host", "missing", run_dir)
    return Follow(run_dir, spec, state, offsets, once).run()


class Follow:
    def __init__(self, run_dir, spec, state, offsets, once):
        self.run_dir, self.spec, self.state, self.offsets, self.once = run_dir, spec, state, offsets, once
        self.ranks = [r["rank"] for r in spec["ranks"]]
        self.handles, self.sent_exit, self.exits = {}, set(), {}
        self.last_beat = self.last_collect = 0.0
        self.sup_alive = True

    def run(self):
        while True:
            now = time.time()
            self.refresh_exits(now)
            progressed = False
            for rank in self.ranks:
                progressed = self.send_rank(rank) or progressed
            if now - self.last_beat >= HEARTBEAT_EVERY:
                emit(b"H", 0, 0, json.dumps({"now": now, "supervisor_alive": self.sup_alive}).encode())
                self.last_beat = now
                progressed = True
            if progressed:
                sys.stdout.buffer.flush()
            if len(self.sent_exit) == len(self.ranks) or self.once:
                emit(b"E", 0, 0, b"{}")
                sys.stdout.buffer.flush()
                return 0
            if self.state is None:
                self.state = read_json(os.path.join(self.run_dir, "state.json"))
            if not progressed:
                time.sleep(IDLE_SLEEP)

    def refresh_exits(self, now):
        if now - self.last_collect >= HEARTBEAT_EVERY or self.once:
            # the expensive part (is the supervisor alive? are ranks lost?) once a second
            self.exits, self.sup_alive = collect_exits(self.run_dir, self.spec, self.state)
            self.last_collect = now
            return
        for rank in self.ranks:
            if rank not in self.exits and os.path.exists(exit_path(self.run_dir, rank)):
                rec = read_json(exit_path(self.run_dir, rank))
                if rec is not None:
                    self.exits[rank] = rec

    def send_rank(self, rank):
        """New log bytes of one rank, then its exit once the log is drained; True if anything was sent."""
        fh = self.handles.get(rank)
        if fh is None:
            try:
                fh = self.handles[rank] = open(log_path(self.run_dir, rank), "rb")
            except OSError:  # no log file (it could not start): its exit still goes out
                return self.send_exit(rank, 0)
        offset = self.offsets.get(rank, 0)
        sent = False
        if os.fstat(fh.fileno()).st_size > offset:
            fh.seek(offset)
            while True:
                data = fh.read(CHUNK)
                if not data:
                    break
                emit(b"L", rank, offset, data)
                offset += len(data)
                sent = True
                if len(data) < CHUNK:
                    break
            self.offsets[rank] = offset
        if os.fstat(fh.fileno()).st_size == offset:
            sent = self.send_exit(rank, offset) or sent
        return sent

    def send_exit(self, rank, offset):
        if rank not in self.exits or rank in self.sent_exit:
            return False
        emit(b"X", rank, offset, json.dumps(self.exits[rank]).encode())
        self.sent_exit.add(rank)
        return True
