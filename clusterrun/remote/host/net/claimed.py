"""A run on this host that serves (or is about to serve) a master port: a live run whose rank 0 is here
with that MASTER_PORT. A run just started binds its port only once its Python has imported torch
(seconds later), so a free port alone does not mean that a second run may take it: its workers would
join the first run's rendezvous and break both."""

import os

from ..files import read_json
from ..paths import attempt_dirs, exit_path
from ..procs import same_process


def run_on_port(workdir, port):
    """{"run_id", "rank": 0, "starting"} of a live run here whose rank 0 uses port (and has not ended);
    None if there is none."""
    runs = os.path.join(workdir, "runs")
    try:
        names = sorted(os.listdir(runs), reverse=True)  # the newest first
    except OSError:
        return None
    for name in names:
        root = os.path.join(runs, name)
        for folder in [root] + attempt_dirs(root):
            found = _claim(folder, port)
            if found is not None:
                return found
    return None


def _claim(folder, port):
    spec = read_json(os.path.join(folder, "spec.json"))
    if not spec or spec.get("node_rank") != 0 or not _uses(spec, str(port)):
        return None
    state = read_json(os.path.join(folder, "state.json")) or {}
    sup = state.get("supervisor") or {}
    ended = os.path.exists(os.path.join(folder, "done.json")) or \
        all(os.path.exists(exit_path(folder, r["rank"])) for r in spec.get("ranks") or ())
    if ended or not same_process(sup.get("pid"), sup.get("ticks")):
        return None
    return {"run_id": spec.get("run_id") or os.path.basename(folder), "rank": 0, "starting": True}


def _uses(spec, port):
    """Its ranks' MASTER_PORT, or under torchrun its --rdzv-endpoint, is this port."""
    if any((r.get("env") or {}).get("MASTER_PORT") == port for r in spec.get("ranks") or ()):
        return True
    return any(str(a).endswith(":" + port) for a in spec.get("command") or ())
