"""Dispatch of the host program's commands (see the package docstring): each lives in the module of
its name and imports only what it needs (every push, follow and stop starts this program anew, and on a
host that runs many ranks, or a test box that plays many hosts, its start-up is CPU of its own)."""

import os
import sys

from .paths import run_dir_of
from .wire import Fail, fail_frame, reply, send_msg

# command -> (module, function, what its arguments are: "run" = a run folder first, then the rest)
COMMANDS = {
    "receive": ("push.receive", "cmd_receive", "workdir+run"),
    "start": ("run.start", "cmd_start", "run"),
    "stop": ("run.stop", "cmd_stop", "run"),
    "follow": ("observe.follow", "cmd_follow", "run"),
    "status": ("observe.status", "cmd_status", "run"),
    "cat": ("observe.cat", "cmd_cat", "run"),
    "pull": ("observe.pull", "cmd_pull", "workdir+run"),
    "stacks": ("observe.stacks", "cmd_stacks", "run"),
    "samples": ("observe.samples", "cmd_samples", "workdir"),
    "runs": ("disk.runs", "cmd_runs", "workdir"),
    "clean": ("disk.clean", "cmd_clean", "workdir"),
    "free-port": ("net.free_port", "cmd_free_port", ""),
    "bandwidth": ("net.bandwidth", "cmd_bandwidth", ""),
    "claims": ("share.claims", "cmd_claims", ""),
    "gpu-check": ("share.gpu_health", "cmd_gpu_check", "workdir"),
    "leftovers": ("share.leftovers", "cmd_leftovers", "workdir"),
}
# commands that do not answer a JSON line: receive and pull speak framed messages, follow frames
FAIL_AS = {"receive": send_msg, "pull": send_msg, "follow": fail_frame}


def _arguments(kind, workdir, args):
    if kind == "run":
        return [run_dir_of(workdir, args[0])] + list(args[1:])
    if kind == "workdir+run":
        return [workdir, run_dir_of(workdir, args[0])] + list(args[1:])
    if kind == "workdir":
        return [workdir] + list(args)
    return list(args)


def main(argv):
    os.umask(0o077)
    workdir, command, args = os.path.expanduser(argv[1]), argv[2], argv[3:]
    os.makedirs(workdir, 0o700, exist_ok=True)
    try:
        if command not in COMMANDS:
            raise Fail("unknown command %r" % command, "protocol")
        module, function, kind = COMMANDS[command]
        handler = getattr(__import__("%s.%s" % (__package__, module), fromlist=[function]), function)
        return handler(*_arguments(kind, workdir, args))
    except Fail as exc:
        answer = {"error": str(exc), "kind": exc.kind, "path": exc.path}
        FAIL_AS.get(command, reply)(answer)  # in the form the command speaks
        return 1
    except BrokenPipeError:
        return 1


def run(argv):
    """main, then the process's end without the interpreter's teardown: every host program is a short-lived
    process that has written all it leaves behind (files atomically, its answers flushed here) by the time
    main returns, and tearing down its modules' objects cost ~2.5 ms of CPU per process for nothing. An
    exception main lets out still ends the process as Python ends it (traceback, exit 1)."""
    code = main(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the controller is gone: nobody reads what is left
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
