"""A run's state on this host, read back from its files: what started, what ended, what is lost."""

import os
import time

from ..stdlib import signal
from ..files import read_json, write_json_atomic
from ..paths import exit_path
from ..wire import Fail
from ..procs import process_marker, rank_live, run_members, same_process
from ..secrets import scrub_run



FOLLOWED = "followed"  # touched once a second by every `follow` of the run (follow.py): a controller watches


def mark_followed(run_dir):
    try:
        os.utime(os.path.join(run_dir, FOLLOWED))
    except FileNotFoundError:
        os.close(os.open(os.path.join(run_dir, FOLLOWED), os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:  # a run folder going away: nobody is watching it any more
        pass


def followed_within(run_dir, seconds):
    """Whether a controller followed the run (its `follow`, the launch's or `logs -f`'s, was here) within
    the last seconds."""
    try:
        return time.time() - os.stat(os.path.join(run_dir, FOLLOWED)).st_mtime <= seconds
    except OSError:
        return False


def load_state(run_dir, must_exist=True):
    """(spec, state); (None, None) for a run that was pushed (or not even that) but never started."""
    state = read_json(os.path.join(run_dir, "state.json"))
    spec = read_json(os.path.join(run_dir, "spec.json"))
    if spec is None:
        if os.path.isdir(run_dir) or not must_exist:
            return None, None
        raise Fail("no such run on this host", "missing", run_dir)
    return spec, state


def rank_ids(spec, state):
    """The ranks of this host: the spec's, or under torchrun the ones its rendezvous gave (once they
    registered; until then, and if none ever does, the ones clusterrun expected here)."""
    if spec.get("launcher") == "torchrun" and (state or {}).get("ranks"):
        return sorted(int(k) for k in state["ranks"])
    return [r["rank"] for r in spec["ranks"]]


def supervisor_done(run_dir):
    return os.path.exists(os.path.join(run_dir, "done.json"))


def collect_exits(run_dir, spec, state, check_lost=True):
    """Exit records by rank; with check_lost, make up 'lost' ones for ranks gone without a record.

    A rank is lost when its supervisor is gone and so is the rank: nobody is left to record its exit.
    Once every rank of a run whose supervisor died has its record, what that supervisor left undone is
    finished (finish_orphan).
    """
    sup = (state or {}).get("supervisor", {})
    sup_alive = same_process(sup.get("pid"), sup.get("ticks"))
    check_lost = check_lost and not sup_alive and _settled(run_dir, state)
    exits = {}
    for rank in rank_ids(spec, state):
        rec = read_json(exit_path(run_dir, rank))
        if rec is None and check_lost:
            rec = _lost(run_dir, spec, state, rank)
        if rec is not None:
            exits[rank] = rec
    if check_lost and state is not None and len(exits) == len(rank_ids(spec, state)) \
            and not supervisor_done(run_dir):
        finish_orphan(run_dir, spec)
    return exits, sup_alive


def _settled(run_dir, state):
    """Whether a supervisor that is not running has had its chance: one with no state yet may be about to
    write it, so it gets 30 s after its spec was written before anything is called lost."""
    if state is not None:
        return True
    try:
        return time.time() - os.path.getmtime(os.path.join(run_dir, "spec.json")) > 30
    except OSError:
        return False


def _lost(run_dir, spec, state, rank):
    """The record of a rank nobody is left to record (None while the rank itself still lives)."""
    info = (state or {}).get("ranks", {}).get(str(rank))
    if info is not None and rank_live(process_marker(spec), info):
        return None
    rec = {"rank": rank, "exit_code": None, "signal": None, "ended_at": time.time(), "stopped": False,
           "lost": True, "error": "the supervisor on this host is gone; exit status unknown"}
    try:
        write_json_atomic(exit_path(run_dir, rank), rec, exclusive=True)
    except OSError:  # a full disk (what may have killed the supervisor): the answer still says it
        return rec
    return read_json(exit_path(run_dir, rank)) or rec


def finish_orphan(run_dir, spec):
    """What a supervisor that died (SIGKILL, OOM, a bug) left undone, done by the next host-program call
    that finds it so (status, follow, stop, runs, clean): what is left of its processes is killed, the
    secrets scrubbed from the run's files, and the run marked done."""
    for pid in run_members(process_marker(spec)):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        scrub_run(run_dir, spec)
        write_json_atomic(os.path.join(run_dir, "done.json"), {"ended_at": time.time(), "orphaned": True})
    except OSError:  # a full disk: the next call tries again
        pass
    if spec.get("claim"):  # its claim is stale already (its owner is gone); this removes the file too
        from ..share.claims import release

        sup = (read_json(os.path.join(run_dir, "state.json")) or {}).get("supervisor") or {}
        release(spec["claim"], owner=sup.get("pid"))
