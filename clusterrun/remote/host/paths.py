"""Where a run's files are on this host: WORKDIR/runs/RUN (attempt K of a run in RUN/attempt-K, sharing
RUN/job), and the per-rank log, exit and stacks files in each."""

import os

from .wire import Fail

ATTEMPT_PREFIX = "attempt-"


def run_root(run_dir):
    """The run's own folder: attempt K of a run (job.restarts) lives in RUN/attempt-K and shares RUN's job."""
    name = os.path.basename(run_dir)
    if name.startswith(ATTEMPT_PREFIX) and name[len(ATTEMPT_PREFIX):].isdigit():
        return os.path.dirname(run_dir)
    return run_dir


def job_dir(run_dir):
    return os.path.join(run_root(run_dir), "job")


def attempt_dirs(root):
    """The folders of attempts 1.. of a run, in order."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = [n for n in names if n.startswith(ATTEMPT_PREFIX) and n[len(ATTEMPT_PREFIX):].isdigit()]
    return [os.path.join(root, n) for n in sorted(found, key=lambda n: int(n[len(ATTEMPT_PREFIX):]))]


def exit_path(run_dir, rank):
    return os.path.join(run_dir, "rank-%d.exit" % rank)


def log_path(run_dir, rank):
    return os.path.join(run_dir, "rank-%d.log" % rank)


def stacks_dir(run_dir):
    """Where the ranks' bootstrap dumps their stacks (run/bootstrap.py, observe/stacks.py)."""
    return os.path.join(run_dir, "stacks")


def stacks_file(run_dir, rank, pid=None):
    """A rank's stacks file; pid: that of a process the rank forked (it dumps into a file of its own)."""
    base = os.path.join(stacks_dir(run_dir), "rank-%d" % rank)
    return base if pid is None else "%s.%d" % (base, pid)


def run_dir_of(workdir, run_id):
    """RUN, or RUN/attempt-K for attempt K of a run (job.restarts); nothing else."""
    runs = os.path.join(workdir, "runs")
    path = os.path.normpath(os.path.join(runs, run_id))
    parent = os.path.dirname(path)
    if parent != runs and not (os.path.dirname(parent) == runs and run_root(path) == parent):
        raise Fail("bad run id %r" % run_id, "protocol")
    return path
