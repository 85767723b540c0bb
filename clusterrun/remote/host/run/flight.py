"""NCCL's Flight Recorder, read back when a run hangs: which rank is behind, at which collective.

With backend nccl every rank keeps its last collectives (plan.flight_recorder_env sets the variables)
and dumps them into the run folder: on NCCL's watchdog timeout, or when a byte is written to its pipe
(RUN/nccl_trace_pipe_rank_R.pipe, made by torch), which is how the hang watch (hang.py) asks before it
stops a hung run. A rank that never created its pipe (not NCCL, or stuck before its first collective)
is simply not asked.

The dump (torch/csrc/distributed/c10d/FlightRecorder, read by torch's own analyzer in
torch/distributed/flight_recorder/components/loader.py) is one pickle per rank, RUN/nccl_trace_rank_R
(R the global rank), of builtin types only:
  {"version": "2.x", "pg_config": {...}, "pg_status": {...}, "nccl_comm_state": {...},
   "entries": [{"record_id", "pg_id", "process_group": [name, desc], "collective_seq_id", "p2p_seq_id",
                "op_id", "profiling_name": "nccl:all_reduce", "time_created_ns", "input_sizes",
                "output_sizes", "state": "scheduled" | "started" | "completed", "retired", "timeout_ms",
                "is_p2p", "frames": [{"name", "filename", "line"}], ...}]}
It is read with an unpickler that builds builtin containers only: any class in the stream is refused.
"""

import os
import time

from ..words import behind_text

PREFIX = "nccl_trace_rank_"
PIPE_PREFIX = "nccl_trace_pipe_rank_"
PATH_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
DUMP_WAIT = 3.0  # after asking through the pipes, how long the ranks get to write their dumps
MAX_BYTES = 64 << 20


def _dump_rank(name):
    """The rank of a dump's file name (PREFIX + digits), or None (no regex: re is not loaded on the
    launch's path, stdlib.py)."""
    digits = name[len(PREFIX):] if name.startswith(PREFIX) else ""
    return int(digits) if digits.isascii() and digits.isdigit() else None


def _plain_load(data):
    """Unpickle builtin containers only (pickle loaded here: every supervisor imports this module for
    PATH_ENV, and only a hung NCCL run reads a dump)."""
    import io
    import pickle

    class Plain(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError("a Flight Recorder dump holds builtin types only, not %s.%s" % (module, name))

    return Plain(io.BytesIO(data)).load()


def read_dump(path):
    """One rank's dump as a dict; ValueError when it is not one."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError("%s is over %d bytes" % (path, MAX_BYTES))
    try:
        dump = _plain_load(data)
    except Exception as exc:  # any unpickling problem: a truncated or foreign file
        raise ValueError("%s: not a Flight Recorder dump (%s)" % (path, exc)) from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise ValueError("%s: not a Flight Recorder dump (no entries)" % path)
    return dump


def _where(entry):
    frames = entry.get("frames") or []
    f = frames[0] if frames else None
    return "%s:%s in %s" % (os.path.basename(str(f.get("filename", "?"))), f.get("line", "?"), f.get("name", "?")) \
        if isinstance(f, dict) else ""


def last_collective(dump):
    """The rank's newest collective (p2p left out): {"seq", "op", "state", "group", "where"}, or None."""
    best = None
    for e in dump.get("entries") or ():
        if not isinstance(e, dict) or e.get("is_p2p") or e.get("collective_seq_id") is None:
            continue
        if best is None or int(e["collective_seq_id"]) >= int(best["collective_seq_id"]):
            best = e
    if best is None:
        return None
    op = str(best.get("profiling_name") or "?").split(":", 1)[-1]
    group = best.get("process_group") or ["", ""]
    return {"seq": int(best["collective_seq_id"]), "op": op, "state": str(best.get("state") or "?"),
            "group": str(group[0]) if group else "", "where": _where(best)}


def read_all(run_dir):
    """({rank: last_collective or None}, {rank: why its dump could not be read}) of every dump here."""
    lasts, errors = {}, {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return lasts, errors
    for name in names:
        rank = _dump_rank(name)
        if rank is None:
            continue
        try:
            lasts[rank] = last_collective(read_dump(os.path.join(run_dir, name)))
        except (OSError, ValueError) as exc:
            errors[rank] = str(exc)
    return lasts, errors


def ask_for_dumps(run_dir, ranks, wait=DUMP_WAIT):
    """Write to each rank's pipe (where torch made one), then wait for their dumps; the ranks asked."""
    asked = []
    for rank in ranks:
        path = os.path.join(run_dir, "%s%d.pipe" % (PIPE_PREFIX, rank))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: nobody reads it, ENOENT: no pipe
        except OSError:
            continue
        try:
            os.write(fd, b"1")
            asked.append(rank)
        except OSError:
            pass
        finally:
            os.close(fd)
    deadline = time.time() + (wait if asked else 0.0)
    while time.time() < deadline and not all(os.path.exists(os.path.join(run_dir, "%s%d" % (PREFIX, r)))
                                             for r in asked):
        time.sleep(0.1)
    return asked


def evidence(run_dir, ranks, host_name=""):
    """What hang.json keeps of the Flight Recorder: each rank's last collective, who is behind."""
    asked = ask_for_dumps(run_dir, ranks)
    lasts, errors = read_all(run_dir)
    if not lasts and not errors:
        return None
    hosts = dict((r, host_name) for r in lasts) if host_name else None
    return {"asked": asked, "ranks": dict((str(r), c) for r, c in sorted(lasts.items())),
            "errors": dict((str(r), e) for r, e in sorted(errors.items())), "cause": behind_text(lasts, hosts)}
