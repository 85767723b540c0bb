"""Stop a run on this host by its recorded process groups: TERM, grace, KILL; idempotent."""

import os
import time

from ..stdlib import signal
from ..files import read_json, write_json_atomic
from ..paths import attempt_dirs, run_root
from ..procs import process_marker, rank_live, run_members, same_process, signal_rank
from ..observe.state import collect_exits, load_state, rank_ids
from ..wire import reply



def cmd_stop(run_dir, grace, reason="stopped"):
    """Stop the run on this host: the attempt named, or with the run's own folder, every attempt of it."""
    grace = float(grace)
    attempts = attempt_dirs(run_dir) if run_root(run_dir) == run_dir else []
    answers = [_stop_one(d, grace, reason) for d in [run_dir] + attempts]
    answer = answers[0]
    for other in answers[1:]:  # the exits of the latest attempt are what the registry wants
        if other.get("exits"):
            answer = dict(other, left=answer["left"] + other["left"])
    reply(dict(answer, now=time.time()))  # this host's clock: the exit records' times are on it
    return 0


def _stop_one(run_dir, grace, reason):
    spec, state = load_state(run_dir, must_exist=False)
    if spec is None:
        from ..share import waiter

        if waiter.stop(run_dir):  # it waited for its turn (--detach --wait), or had just started
            spec, state = load_state(run_dir, must_exist=False)
    if spec is None:  # pushed (or partly) but never started: nothing runs, so the files go too
        return _remove_unstarted(run_dir)
    marker = process_marker(spec)
    write_json_atomic(os.path.join(run_dir, "stop.json"), {"grace": grace, "reason": reason,
                                                          "requested_at": time.time()})
    state = _await_state(run_dir, state)
    exits, sup_alive = collect_exits(run_dir, spec, state)
    sup = (state or {}).get("supervisor", {})
    targets = _targets(state, [r for r in rank_ids(spec, state) if r not in exits])
    if targets:
        _terminate(marker, targets, sup, sup_alive)
    killed = _wait_or_kill(marker, targets, grace)
    _kill_strays(marker)
    state = _await_exit_records(run_dir, spec, state, sup)
    exits, sup_alive = collect_exits(run_dir, spec, state)
    if spec.get("claim") and reason != "failed":  # a failed attempt's claim stays for the next (job.restarts)
        from ..share.claims import release

        release(spec["claim"])
    return {"exits": {str(k): v for k, v in exits.items()}, "killed": killed,
            "left": [name for name, info in targets.items() if rank_live(marker, info)]}


def _remove_unstarted(run_dir):
    if run_root(run_dir) != run_dir:  # an attempt folder that never started: nothing was pushed there
        return {"exits": {}, "left": [], "note": "never started"}
    import shutil  # only here: it loads re (stdlib.py)

    removed = os.path.isdir(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"exits": {}, "left": [], "note": "never started" + ("; pushed files removed" if removed else "")}


def _await_state(run_dir, state):
    """The run's state, waiting a little for a supervisor that is starting right now (it reads stop.json
    first)."""
    waited = time.time() + 5.0
    while state is None and time.time() < waited:
        time.sleep(0.02)
        state = read_json(os.path.join(run_dir, "state.json"))
    return state


def _terminate(marker, targets, sup, sup_alive):
    """TERM to the supervisor, which stops its ranks itself; without one alive, to each target."""
    if sup_alive:
        try:
            os.kill(sup["pid"], signal.SIGTERM)
            return
        except ProcessLookupError:  # it ended since we looked (its ranks did, or it read stop.json itself)
            pass
    for info in targets.values():
        signal_rank(marker, info, signal.SIGTERM)


def _kill_strays(marker):
    for pid in run_members(marker):  # anything of this node of the run that left its process group
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _await_exit_records(run_dir, spec, state, sup):
    """The latest state, once the supervisor (if any) wrote every exit record, or ended, or 2 s passed."""
    waited = time.time() + 2.0
    while time.time() < waited:
        state = read_json(os.path.join(run_dir, "state.json")) or state
        exits, _ = collect_exits(run_dir, spec, state)
        if len(exits) == len(rank_ids(spec, state)) or not same_process(sup.get("pid"), sup.get("ticks")):
            break
        time.sleep(0.02)
    return state


def _targets(state, pending):
    """name -> recorded process info of everything that may still run: pending ranks, and torchrun itself."""
    infos = (state or {}).get("ranks", {})
    targets = {str(rank): infos.get(str(rank), {}) for rank in pending}
    launcher = (state or {}).get("launcher") or {}
    if launcher.get("pid") and same_process(launcher["pid"], launcher.get("ticks")):
        targets["launcher"] = launcher
    return targets


def _wait_or_kill(marker, targets, grace):
    """Wait up to the grace for every target to end, then KILL what is left; True if anything was killed."""
    deadline = time.time() + grace
    killed = False
    while True:
        live = [info for info in targets.values() if rank_live(marker, info)]
        if not live:
            return killed
        if time.time() >= deadline and not killed:
            for info in live:
                signal_rank(marker, info, signal.SIGKILL)
            killed = True
        elif killed and time.time() >= deadline + 5:
            return killed
        time.sleep(0.02)
