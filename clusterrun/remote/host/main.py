"""Dispatch of the host program's commands (see the package docstring), and the small ones."""

import os
import shutil
import socket
import sys
import time

from .common import CAT_LIMIT, Fail, free_port, job_dir, reply, run_root, send_msg

# Each command imports only its own modules: every push, follow and stop starts this program anew, and
# on a host that runs many ranks (or a test box that plays many hosts) its start-up is CPU of its own.



def cmd_cat(run_dir, rel):
    """A file of the run's job folder (metrics.json, say), raw on stdout; never anything outside it."""
    job = os.path.realpath(job_dir(run_dir))
    path = os.path.realpath(os.path.join(job, rel))
    if not path.startswith(job + os.sep):
        raise Fail("%r is outside the run's job folder" % rel, "protocol")
    try:
        with open(path, "rb") as fh:
            data = fh.read(CAT_LIMIT + 1)
    except OSError as exc:
        raise Fail("cannot read %s: %s" % (rel, exc.strerror), "missing", path) from None
    if len(data) > CAT_LIMIT:
        raise Fail("%s is larger than %d bytes" % (rel, CAT_LIMIT), "too_big", path)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


def cmd_free_port():
    reply({"port": free_port()})
    return 0


def cmd_probe(workdir):
    import platform
    usage = shutil.disk_usage(workdir if os.path.isdir(workdir) else os.path.dirname(workdir) or "/")
    reply({"python": platform.python_version(), "executable": sys.executable, "hostname": socket.gethostname(),
           "time": time.time(), "disk_free": usage.free, "platform": sys.platform})
    return 0


def main(argv):
    os.umask(0o077)
    workdir, command, args = os.path.expanduser(argv[1]), argv[2], argv[3:]
    os.makedirs(workdir, 0o700, exist_ok=True)

    def run_dir():
        """RUN, or RUN/attempt-K for attempt K of a run (job.restarts); nothing else."""
        runs = os.path.join(workdir, "runs")
        path = os.path.normpath(os.path.join(runs, args[0]))
        parent = os.path.dirname(path)
        if parent != runs and not (os.path.dirname(parent) == runs and run_root(path) == parent):
            raise Fail("bad run id %r" % args[0], "protocol")
        return path

    try:
        if command == "receive":
            from .receive import cmd_receive
            return cmd_receive(workdir, run_dir())
        if command == "start":
            from .supervise import cmd_start
            return cmd_start(run_dir())
        if command == "follow":
            from .follow import cmd_follow
            return cmd_follow(run_dir(), args[1], once="--once" in args[2:])
        if command == "status":
            from .runstate import cmd_status
            return cmd_status(run_dir())
        if command == "stop":
            from .stop import cmd_stop
            return cmd_stop(run_dir(), float(args[1]), args[2] if len(args) > 2 else "stopped")
        if command == "cat":
            return cmd_cat(run_dir(), args[1])
        if command == "free-port":
            return cmd_free_port()
        if command == "probe":
            return cmd_probe(workdir)
        if command == "runs":
            from .clean import cmd_runs
            return cmd_runs(workdir)
        if command == "clean":
            from .clean import cmd_clean
            return cmd_clean(workdir)
        raise Fail("unknown command %r" % command, "protocol")
    except Fail as exc:
        answer = {"error": str(exc), "kind": exc.kind, "path": exc.path}
        send_msg(answer) if command == "receive" else reply(answer)  # receive speaks framed messages
        return 1
    except BrokenPipeError:
        return 1
