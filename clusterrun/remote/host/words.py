"""How clusterrun says a rank's and a run's end, in one place for both sides: the controller's verdicts
(outcome.py, what `ps`, `logs` and the launch show) and the host program's own (notify's CLUSTERRUN_REASON,
the mesh's word of a peer's failure), which are made on a host with no controller. Pure, stdlib only."""

import signal as _signal

INTERRUPTED = "interrupted by the user (Ctrl-C)"


def signal_name(sig):
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return "signal %s" % sig


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
