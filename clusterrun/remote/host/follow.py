"""Follow a run: log bytes from given offsets, exit records and heartbeats, as frames on stdout."""

import json
import os
import sys
import time

from .common import CHUNK, FRAME, HEARTBEAT_EVERY, IDLE_SLEEP, Fail, exit_path, log_path, read_json
from .runstate import load_state, settle



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
