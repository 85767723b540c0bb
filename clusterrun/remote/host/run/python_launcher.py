"""launcher python: the supervisor starts one process per rank, each in its own process group (its pid),
through the bootstrap (bootstrap.py: stacks on a signal, then the rank's entry exactly as given)."""

import errno
import os
import time

from ..stdlib import signal
from ..files import open_regular
from ..paths import job_dir, log_path, stacks_file
from ..procs import death_signal_ready, rank_child, start_ticks
from .supervisor import Supervisor


class RankSupervisor(Supervisor):
    """launcher python: one process per rank, each in its own process group (its pid)."""

    def __init__(self, run_dir, spec, wake_fd=None):
        Supervisor.__init__(self, run_dir, spec, wake_fd)
        self.procs = {}
        self.stopped = set()  # ranks clusterrun stopped

    def start(self):
        """Every rank of this host at once; with spec start_gap (job.start order rank) one after another in
        rank order, start_gap seconds apart (a stop meanwhile starts no more)."""
        stopped_early = os.path.exists(os.path.join(self.run_dir, "stop.json"))
        gap = self.spec.get("start_gap")
        death_signal_ready()  # loaded here, once: each rank's fork only calls it (rank_child)
        for i, r in enumerate(self.spec["ranks"]):
            rank = r["rank"]
            if i and gap and not stopped_early:
                stopped_early = not self.pause(float(gap))
            if stopped_early:  # stopped between start and now: start nothing, record why
                self.record(rank, stopped=True, error="stopped before it started")
                continue
            env = self.environment(r["env"])
            try:  # a FIFO a previous attempt's rank left as its log would block here for ever
                fd = open_regular(log_path(self.run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            except OSError as exc:
                self.record(rank, exit_code=127, started_at=time.time(), error="cannot open its log: %s" % exc)
                continue
            argv = with_bootstrap(r["argv"], stacks_file(self.run_dir, rank), os.getpid())
            try:
                proc = Rank(spawn(argv, job_dir(self.run_dir), env, fd))
            except OSError as exc:
                os.write(fd, ("clusterrun: cannot start rank %d (%s): %s\n" % (rank, r["argv"][0], exc)).encode())
                self.record(rank, exit_code=127, started_at=time.time(), error=str(exc))
                continue
            finally:
                os.close(fd)
            self.procs[rank] = proc
            self.ranks[str(rank)] = {"pid": proc.pid, "pgid": proc.pid, "ticks": start_ticks(proc.pid),
                                     "started_at": time.time()}

    def pause(self, seconds):
        """Wait between two ranks' starts; False when a stop came meanwhile (a signal or stop.json)."""
        end = time.time() + seconds
        while time.time() < end:
            if self.requested or os.path.exists(os.path.join(self.run_dir, "stop.json")):
                return False
            self.poll(time.time())  # a rank that ended meanwhile is recorded (and may fail the run)
            time.sleep(min(0.05, max(0.0, end - time.time())))
        return not self.requested

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


class Rank:
    """A rank this supervisor started: its pid, and once it has ended its exit code (negative: the signal
    that ended it), as subprocess.Popen.poll says it."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its end is all there is to know
                pid, status = self.pid, 0
            if pid:
                self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.returncode


def spawn(argv, cwd, env, out):
    """Start one rank as subprocess.Popen(argv, cwd=cwd, env=env, stdin=DEVNULL, stdout=out, stderr=out,
    start_new_session=True, close_fds=True, preexec_fn=rank_child) would (its own session and process
    group, dying with this process, SIGHUP, SIGPIPE and SIGXFSZ back to their defaults, nothing but 0-2 open), without importing subprocess
    (its import is most of a supervisor's start on every host of every run); its pid. OSError (with the
    errno the exec failed with) when it could not be started."""
    report_r, report_w = os.pipe()  # close-on-exec: EOF once the exec worked, else the child's errno
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: only os calls from here to the exec
        code = errno.EINVAL
        try:
            os.close(report_r)
            os.setsid()
            rank_child(parent)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            _close_from_3(keep=report_w)
            for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; a program started from it should not
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            code = exc.errno or errno.EINVAL
        finally:
            os.write(report_w, str(code).encode())
            os._exit(127)
    os.close(report_w)
    try:
        said = os.read(report_r, 64)
    finally:
        os.close(report_r)
    if said:
        os.waitpid(pid, 0)
        code = int(said)
        raise OSError(code, os.strerror(code), argv[0])
    return pid


def _close_from_3(keep):
    """Every fd from 3 up but keep, as close_fds does: those /proc lists (any number), else up to 65536."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(3, 1 << 16)
    for fd in fds:
        if fd >= 3 and fd != keep:
            try:
                os.close(fd)
            except OSError:  # the listing's own fd, already gone
                pass


BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")


def with_bootstrap(argv, stacks, tracer):
    """`python ENTRY...` as `python bootstrap.py STACKS TRACER ENTRY...`, where ENTRY is a script, -m or -c
    (an interpreter option first, which the bootstrap would have to mimic too, is left as it is)."""
    argv = list(argv)
    if len(argv) < 2 or (argv[1].startswith("-") and argv[1] not in ("-m", "-c")):
        return argv
    return argv[:1] + [BOOTSTRAP, stacks, str(tracer)] + argv[1:]
