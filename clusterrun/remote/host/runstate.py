"""A run's state on this host, read back from its files: what started, what ended, what is lost."""

import os
import time

from .files import read_json, write_json_atomic
from .paths import exit_path
from .wire import Fail
from .procs import process_marker, rank_live, same_process



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
    """
    exits = {}
    sup = (state or {}).get("supervisor", {})
    sup_alive = same_process(sup.get("pid"), sup.get("ticks"))
    if state is None:
        try:  # the supervisor may be about to write its state; give it time before calling anything lost
            check_lost = check_lost and time.time() - os.path.getmtime(os.path.join(run_dir, "spec.json")) > 30
        except OSError:
            check_lost = False
    for rank in rank_ids(spec, state):
        rec = read_json(exit_path(run_dir, rank))
        if rec is None and check_lost and not sup_alive:
            info = (state or {}).get("ranks", {}).get(str(rank))
            if info is None or not rank_live(process_marker(spec), info):
                rec = {"rank": rank, "exit_code": None, "signal": None, "ended_at": time.time(), "stopped": False,
                       "lost": True, "error": "the supervisor on this host is gone; exit status unknown"}
                write_json_atomic(exit_path(run_dir, rank), rec, exclusive=True)
                rec = read_json(exit_path(run_dir, rank))
        if rec is not None:
            exits[rank] = rec
    return exits, sup_alive
