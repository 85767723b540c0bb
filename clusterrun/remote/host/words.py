"""How clusterrun says a rank's and a run's end, in one place for both sides: the controller's verdicts
(outcome.py, what `ps`, `logs` and the launch show) and the host program's own (notify's CLUSTERRUN_REASON,
the mesh's word of a peer's failure), which are made on a host with no controller. Pure, stdlib only."""

from .stdlib import signal_names

INTERRUPTED = "interrupted by the user (Ctrl-C)"


_NAMES = []  # {number: name}, made on first use


def signal_name(sig):
    if not _NAMES:
        _NAMES.append(signal_names())
    name = _NAMES[0].get(sig) if isinstance(sig, int) else None
    return name or "signal %s" % sig


def how_it_ended(exit_code=None, sig=None, note=""):
    """`exit code 1`, `killed by signal 9 (SIGKILL)`, `killed by the OOM killer (host memory) (SIGKILL)`;
    note: what the exit record adds (the OOM killer's verdict), else what stands when neither is known."""
    if sig and note.startswith("killed by the OOM killer"):
        return "%s (%s)" % (note, signal_name(sig))
    if sig:
        return "killed by signal %s (%s)" % (sig, signal_name(sig))
    if exit_code is not None:
        return "exit code %s" % exit_code
    return note


def rank_failed(rank, host, how):
    """A run's reason when a rank failed: `rank 1 on node1: exit code 1`."""
    return "rank %s on %s: %s" % (rank, host, how)


def time_limit_reached(seconds=None):
    return "time limit%s reached" % (" of %g s" % seconds if seconds else "")


def ranks_text(ranks):
    """[0, 1, 2, 5] → "ranks 0-2,5"; [7] → "rank 7"."""
    ranks = sorted(ranks)
    runs, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            runs.append("%d" % start if start == r else "%d-%d" % (start, r))
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(runs)


def behind_text(lasts, hosts=None):
    """Who is behind in NCCL's collectives, from {rank: its last one} (run/flight.py's last_collective; the
    controller's outcome.py says a hung run's cause with it too): `ranks 0-6 at all_reduce #640 (started); rank 7 (node3)
    behind at all_reduce #639 (completed)`; "" when every rank is at the same collective and state."""
    known = dict((r, c) for r, c in lasts.items() if c)
    if not known:
        return ""
    groups = {}
    for rank, c in known.items():
        groups.setdefault((c["seq"], c["op"], c["state"]), []).append(rank)
    if len(groups) < 2:
        return ""
    order = sorted(groups.items(), key=lambda kv: (-kv[0][0], -len(kv[1])))
    parts = []
    for (seq, op, state), ranks in order:
        behind = seq < order[0][0][0]
        on = " (%s)" % hosts[ranks[0]] if behind and hosts and len(ranks) == 1 and ranks[0] in hosts else ""
        parts.append("%s%s %sat %s #%d (%s)" % (ranks_text(ranks), on, "behind " if behind else "", op, seq, state))
    return "; ".join(parts)
