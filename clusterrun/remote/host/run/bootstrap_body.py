"""What every rank runs first: `python bootstrap.py STACKS TRACER ENTRY...`, where ENTRY is what followed
the interpreter in the rank's command (`SCRIPT ARGS`, `-m MODULE ARGS` or `-c CODE ARGS`). bootstrap.py is
the few lines Python compiles anew for every rank; it runs this file's code, from the bytecode cache, as
its own (in the script's __main__, which it captured as _START before anything else ran).

It makes the rank's stacks readable without py-spy, then gets out of the way:
  - faulthandler is registered on DUMP_SIGNAL (a real-time signal) for every thread, into STACKS (a file
    under the run folder, never the rank's log). The file starts with one header line
        clusterrun-stacks pid=PID main=0xIDENT signal=SIG
    (main: the main thread's ident, as faulthandler prints it); each dump is appended after it. A process
    this one forks (os.fork, multiprocessing's fork, DataLoader workers) registers again, into
    STACKS.PID. A child that execs, or is spawned (a fresh interpreter), is not covered: py-spy is.
  - With Yama's ptrace_scope at 1 (Ubuntu's default) a process may be traced only by its ancestors: the
    rank names TRACER (its supervisor's pid; 0 = none) with PR_SET_PTRACER, so a py-spy the supervisor
    starts may attach. Nothing else may.
  - It notes where the rank's script itself points MASTER_ADDR or MASTER_PORT (`os.environ[...] = ...`, as
    the DDP tutorial's `localhost`) in STACKS.env, a `KEY=VALUE` line each time, from an audit hook on
    os.putenv that does nothing else: the rendezvous watchdog reads it (rendezvous.py).
  - Then it runs ENTRY exactly as `python ENTRY` would: the same sys.argv, sys.path[0], __main__ module
    (a fresh one: __name__, __file__, __loader__, __spec__ as Python sets them), exit code, and tracebacks
    (this file's frames are cut from an uncaught exception's traceback; an uncaught KeyboardInterrupt still
    ends the process by SIGINT, as CPython does, because it leaves through the interpreter's own top level).
    `-m` runs through runpy._run_module_as_main, the function `python -m` itself calls.

Stdlib only, run only through bootstrap.py (by path, never imported), and cheap: a few hundred
microseconds before ENTRY starts. The host program's side (who reads the header and sends the signal) is
observe/stacks.py.
"""

import faulthandler
import os
import sys

DUMP_SIGNAL = 39  # SIGRTMIN + 5 under glibc: no default use, and its default action is never reached
HERE = (__file__, _BODY)  # noqa: F821 - both set by bootstrap.py, the script: its frames and this file's
PR_SET_PTRACER = 0x59616D61


def _register(path):
    """Dump every thread's stack into path on DUMP_SIGNAL; a header line first."""
    import _thread  # built in: costs nothing (threading may not be imported yet, and need not be)

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    # the thread that registers is the process's main thread (after a fork: the one that forked)
    header = "clusterrun-stacks pid=%d main=0x%016x signal=%d\n" % (os.getpid(), _thread.get_ident(), DUMP_SIGNAL)
    os.write(fd, header.encode())
    out = os.fdopen(fd, "w")
    faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)
    return out


def _allow_tracer(pid):
    """Yama ptrace_scope 1: let the supervisor's children (py-spy) attach to this process."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", "rb") as fh:
            if fh.read(1) != b"1":
                return
        try:  # _ctypes, the C module alone: ctypes' Python layer costs every rank ~4 ms (procs.py does the same)
            import _ctypes

            _ctypes.call_function(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"), (PR_SET_PTRACER, pid, 0, 0, 0))
        except AttributeError:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, pid, 0, 0, 0)
    except (OSError, AttributeError, ImportError, TypeError, ValueError):
        pass


WATCHED_ENV = ("MASTER_ADDR", "MASTER_PORT")


def _watch_env(path):
    """Append `KEY=VALUE` to path whenever the rank sets MASTER_ADDR or MASTER_PORT itself."""
    def hook(event, args):
        if event != "os.putenv":
            return
        try:  # an audit hook that raises would fail the rank's own putenv: never
            key, value = (a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a) for a in args[:2])
            if key in WATCHED_ENV:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    os.write(fd, ("%s=%s\n" % (key, value.replace("\n", " ")[:200])).encode())
                finally:
                    os.close(fd)
        except Exception:  # noqa: BLE001
            pass

    sys.addaudithook(hook)


def _cut(tb):
    """The traceback without this file's frames at its head (what `python ENTRY` would have shown)."""
    while tb is not None and tb.tb_frame.f_code.co_filename in HERE:
        tb = tb.tb_next
    return tb


def _fresh_main(**names):
    """A new __main__ module, as Python makes one for a script (this file's own stays with its functions)."""
    main = type(sys)("__main__")
    main.__dict__.update(_START)  # noqa: F821 - bootstrap.py's
    main.__dict__.update(__doc__=None, **names)
    sys.modules["__main__"] = main
    return main.__dict__


def _run_file(script, args):
    sys.argv = [script] + args
    try:
        with open(script, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        name = (getattr(sys, "orig_argv", None) or [sys.executable])[0]
        sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (name, os.path.abspath(script), exc.errno,
                                                                      exc.strerror))
        raise SystemExit(2) from None
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    path = script if sys.version_info < (3, 9) else os.path.join(os.getcwd(), script)
    code = compile(source, path, "exec", dont_inherit=True)
    names = _fresh_main(__file__=path, __cached__=None, __loader__=type(__loader__)("__main__", path))
    exec(code, names)


def _run_code(text, args):
    sys.argv = ["-c"] + args
    sys.path[0] = ""
    names = _fresh_main(__loader__=sys.__loader__)
    names.pop("__file__", None)
    names.pop("__cached__", None)
    exec(compile(text, "<string>", "exec", dont_inherit=True), names)


def _run_module(name, args):
    import runpy

    sys.argv = ["-m"] + args
    sys.path[0] = os.getcwd()
    names = _fresh_main()
    for key in ("__file__", "__cached__"):
        names.pop(key, None)
    runpy._run_module_as_main(name, alter_argv=True)


def main(argv):
    stacks, tracer, entry = argv[1], int(argv[2]), argv[3:]
    try:
        _register(stacks)
        os.register_at_fork(after_in_child=lambda: _register("%s.%d" % (stacks, os.getpid())))
    except (OSError, ValueError, AttributeError, RuntimeError):
        pass  # no dumps from this rank (py-spy may still read it); the job runs all the same
    if tracer:
        _allow_tracer(tracer)
    if hasattr(sys, "addaudithook"):  # Python 3.8+
        _watch_env(stacks + ".env")
    if entry[0] == "-m":
        _run_module(entry[1], entry[2:])
    elif entry[0] == "-c":
        _run_code(entry[1], entry[2:])
    else:
        _run_file(entry[0], entry[1:])


if __name__ == "__main__":
    main(sys.argv)  # what it raises leaves through bootstrap.py, which cuts the bootstrap's frames (_cut)
