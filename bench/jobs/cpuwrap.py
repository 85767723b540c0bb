"""A host's Python that says where its CPU went (the hostcpu section): run as
`python -S cpuwrap.py OUT_DIR PYTHON_ARGS...`, it runs what `python PYTHON_ARGS...` would (`-c CODE`,
`-m MODULE`, a script; -S kept, else site is loaded as usual) and, as the process ends (also by os._exit,
as a forked supervisor does), writes one JSON file: its own CPU (RUSAGE_SELF: a fork's counts from the
fork), the CPU its interpreter start-up had taken when this file began running the target, its argv and
whether it is a fork of the process that started. Children that are also this wrapper write their own.
"""

import os
import resource
import sys


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


START_CPU = cpu()
START_PID = os.getpid()
OUT = sys.argv[1]
ARGS = sys.argv[2:]
ORIG = list(ARGS)
WRITTEN = []


def _to_json(value):
    """JSON of the record's dict (str, bool, int, float, lists) on _json's C string encoder."""
    from _json import encode_basestring_ascii as text

    if isinstance(value, dict):
        return "{" + ", ".join(text(k) + ": " + _to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_to_json(v) for v in value) + "]"
    if isinstance(value, str):
        return text(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def record():
    if os.getpid() in WRITTEN:
        return
    used = cpu()  # before this function's own imports
    WRITTEN.append(os.getpid())
    import time  # a builtin module; json and socket are not loaded here: what this record costs lands in
    # the "sshd & shells" bucket (the cgroup's rest), and the host program no longer loads them itself

    info = {"host": os.uname().nodename, "pid": os.getpid(), "ppid": os.getppid(), "forked": os.getpid() != START_PID,
            "cpu": used, "startup": 0.0 if os.getpid() != START_PID else START_CPU,
            "argv": [a[:60] for a in ORIG[:12]], "at": time.time()}
    path = os.path.join(OUT, f"{info['host']}-{info['pid']}-{time.monotonic_ns()}.json")
    with open(path + ".tmp", "w") as fh:
        fh.write(_to_json(info))
    os.replace(path + ".tmp", path)


_exit = os._exit


def exit_recorded(code):
    try:
        record()
    finally:
        _exit(code)


os._exit = exit_recorded
import atexit  # noqa: E402

atexit.register(record)

flags = []
while ARGS and ARGS[0].startswith("-") and ARGS[0] not in ("-c", "-m", "-"):
    flags.append(ARGS.pop(0))
if "-S" not in flags:
    import site

    site.main()
if "-u" in flags:
    os.environ["PYTHONUNBUFFERED"] = "1"
PROFILE = None
if ARGS[0] == "-c" and os.path.exists(os.path.join(OUT, "profile")) and len(ARGS) > 4:
    import cProfile  # bench/sections/hostcpu.py --profile: where the host program's own CPU goes

    import time as _time

    PROFILE = cProfile.Profile(_time.process_time)  # CPU, not wall time: waits cost nothing here

    def dump():
        PROFILE.disable()
        PROFILE.dump_stats(os.path.join(OUT, "prof-%s-%s-%d-%d.pstats" % (ARGS[4], os.uname()[1], os.getpid(), os.getpid() != START_PID)))

    atexit.register(dump)
    os._exit = lambda code: (dump(), exit_recorded(code))
    PROFILE.enable()
if ARGS[0] == "-c":
    sys.argv = ["-c", *ARGS[2:]]
    code = compile(ARGS[1], "<string>", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
elif ARGS[0] == "-m":
    import runpy

    sys.argv = [ARGS[1], *ARGS[2:]]
    runpy.run_module(ARGS[1], run_name="__main__", alter_sys=True)
else:  # a script, as python runs one: a __main__ module of its own, kept alive here (a script that puts
    # another __main__ in sys.modules, as clusterrun's rank bootstrap does, would otherwise see its globals cleared)
    sys.argv = list(ARGS)
    sys.path[0] = os.path.dirname(os.path.abspath(ARGS[0]))
    MAIN = type(sys)("__main__")
    MAIN.__file__ = ARGS[0]
    MAIN.__builtins__ = __builtins__
    MAIN.__loader__ = type(__loader__)("__main__", ARGS[0])  # as python gives a script's (SourceFileLoader)
    sys.modules["__main__"] = MAIN
    with open(ARGS[0], "rb") as fh:
        source = fh.read()
    exec(compile(source, ARGS[0], "exec"), MAIN.__dict__)
