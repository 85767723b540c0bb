"""`status`: the run's state on this host as one JSON line (what `ps` reconciles from): whether it
started, each rank's exit record (or a made-up "lost" one when nobody is left to write it), log sizes,
and this host's clock."""

import os
import time

from ..paths import log_path
from .state import collect_exits, load_state, rank_ids, supervisor_done
from ..wire import reply


def cmd_status(run_dir):
    spec, state = load_state(run_dir, must_exist=False)
    if spec is None:  # never started here, or waiting for its turn (share/waiter.py), or given up waiting
        from ..share.waiter import state as waiting

        reply(dict(waiting(run_dir), run_dir=run_dir, started=False, ranks={}))
        return 0
    exits, sup_alive = collect_exits(run_dir, spec, state)
    ranks = {}
    for rank in rank_ids(spec, state):
        try:
            size = os.path.getsize(log_path(run_dir, rank))
        except OSError:
            size = 0
        ranks[str(rank)] = {"exit": exits.get(rank), "log_size": size,
                            "pid": (state or {}).get("ranks", {}).get(str(rank), {}).get("pid")}
    reply({"run_dir": run_dir, "started": True, "supervisor_alive": sup_alive, "now": time.time(),
           "done": len(exits) == len(ranks) and (spec.get("launcher") != "torchrun" or not sup_alive
                                                  or supervisor_done(run_dir)),
           "restarts": (state or {}).get("restarts", 0), "ranks": ranks})
    return 0
