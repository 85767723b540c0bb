"""Stop a run on this host by its recorded process groups: TERM, grace, KILL; idempotent."""

import os
import shutil
import signal
import time

from .common import read_json, reply, write_json_atomic
from .procs import rank_live, run_members, same_process, signal_rank
from .runstate import collect_exits, load_state



def cmd_stop(run_dir, grace):
    spec, state = load_state(run_dir, must_exist=False)
    if spec is None:  # pushed (or partly) but never started: nothing runs, so the files go too
        removed = os.path.isdir(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        reply({"exits": {}, "left": [], "note": "never started" + ("; pushed files removed" if removed else "")})
        return 0
    run_id = spec["run_id"]
    write_json_atomic(os.path.join(run_dir, "stop.json"), {"grace": grace, "requested_at": time.time()})
    waited = time.time() + 5.0
    while state is None and time.time() < waited:  # a supervisor starting right now reads stop.json first
        time.sleep(0.02)
        state = read_json(os.path.join(run_dir, "state.json"))
    exits, sup_alive = collect_exits(run_dir, spec, state)
    sup = (state or {}).get("supervisor", {})
    infos = (state or {}).get("ranks", {})
    pending = [r["rank"] for r in spec["ranks"] if r["rank"] not in exits]
    if pending:
        if sup_alive:
            os.kill(sup["pid"], signal.SIGTERM)
        else:
            for rank in pending:
                signal_rank(run_id, infos.get(str(rank), {}), signal.SIGTERM)
    deadline = time.time() + grace
    killed = False
    while True:
        live = [r for r in pending if rank_live(run_id, infos.get(str(r), {}))]
        if not live:
            break
        if time.time() >= deadline and not killed:
            for rank in live:
                signal_rank(run_id, infos.get(str(rank), {}), signal.SIGKILL)
            killed = True
        elif killed and time.time() >= deadline + 5:
            break
        time.sleep(0.02)
    for pid in run_members(run_id):  # anything of this run that left its process group
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    waited = time.time() + 2.0
    while time.time() < waited:  # let the supervisor (if any) write the exit records
        exits, _ = collect_exits(run_dir, spec, state)
        if len(exits) == len(spec["ranks"]) or not same_process(sup.get("pid"), sup.get("ticks")):
            break
        time.sleep(0.02)
    exits, sup_alive = collect_exits(run_dir, spec, state)
    reply({"exits": {str(k): v for k, v in exits.items()}, "killed": killed,
           "left": [r for r in pending if rank_live(run_id, infos.get(str(r), {}))]})
    return 0
