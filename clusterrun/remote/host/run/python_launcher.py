"""launcher python: the supervisor starts one process per rank, each in its own process group (its pid),
through the bootstrap (bootstrap.py: stacks on a signal, then the rank's entry exactly as given)."""

import os
import subprocess
import time

from ..paths import job_dir, log_path, stacks_file
from ..procs import die_with_parent, start_ticks
from .supervisor import Supervisor


class RankSupervisor(Supervisor):
    """launcher python: one process per rank, each in its own process group (its pid)."""

    def __init__(self, run_dir, spec, wake_fd=None):
        Supervisor.__init__(self, run_dir, spec, wake_fd)
        self.procs = {}
        self.stopped = set()  # ranks clusterrun stopped

    def start(self):
        stopped_early = os.path.exists(os.path.join(self.run_dir, "stop.json"))
        for r in self.spec["ranks"]:
            rank = r["rank"]
            if stopped_early:  # stopped between start and now: start nothing, record why
                self.record(rank, stopped=True, error="stopped before it started")
                continue
            env = self.environment(r["env"])
            fd = os.open(log_path(self.run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            argv = with_bootstrap(r["argv"], stacks_file(self.run_dir, rank), os.getpid())
            try:
                proc = subprocess.Popen(argv, cwd=job_dir(self.run_dir), env=env,
                                        stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                        close_fds=True, preexec_fn=die_with_parent)
            except OSError as exc:
                os.write(fd, ("clusterrun: cannot start rank %d (%s): %s\n" % (rank, r["argv"][0], exc)).encode())
                self.record(rank, exit_code=127, started_at=time.time(), error=str(exc))
                continue
            finally:
                os.close(fd)
            self.procs[rank] = proc
            self.ranks[str(rank)] = {"pid": proc.pid, "pgid": proc.pid, "ticks": start_ticks(proc.pid),
                                     "started_at": time.time()}

    def running(self):
        return bool(self.procs)

    def poll(self, now):
        for rank, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.procs[rank]
            self.record(rank, exit_code=rc if rc >= 0 else None, signal=-rc if rc < 0 else None, ended_at=now,
                        started_at=self.ranks[str(rank)]["started_at"], stopped=rank in self.stopped)
            self.watch_group(proc.pid, now)

    def groups(self, stopping):
        if stopping:
            self.stopped.update(self.procs)
        return [proc.pid for proc in self.procs.values()]


BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")


def with_bootstrap(argv, stacks, tracer):
    """`python ENTRY...` as `python bootstrap.py STACKS TRACER ENTRY...`, where ENTRY is a script, -m or -c
    (an interpreter option first, which the bootstrap would have to mimic too, is left as it is)."""
    argv = list(argv)
    if len(argv) < 2 or (argv[1].startswith("-") and argv[1] not in ("-m", "-c")):
        return argv
    return argv[:1] + [BOOTSTRAP, stacks, str(tracer)] + argv[1:]
