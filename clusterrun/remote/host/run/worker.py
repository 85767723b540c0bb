"""The worker shim that launcher torchrun runs for every worker: `python -u worker.py RUN_DIR -- ENTRY...`.

It is what lets a torchrun worker be a clusterrun rank: it learns the global rank torchrun's rendezvous
gave it (RANK), sends the worker's output to RUN_DIR/rank-<RANK>.log (appended across torchrun's
restarts), registers itself, then runs the user's entry (`script args` or `-m module args`) exactly as
`python -u ENTRY` would, in a child (through bootstrap.py, which makes its stacks readable), and reports
how it ended:

  RUN_DIR/workers/rank-<R>.json     {rank, local_rank, restart, pid, ticks, started_at}   (at start)
  RUN_DIR/workers/rank-<R>.result   {rank, restart, exit_code, signal, stopped, error, traceback,
                                     started_at, ended_at}                                (at the end)

Signals torchrun sends to the worker are forwarded to the child (a stop, not a failure); the child dies
with the shim (PR_SET_PDEATHSIG) should torchrun SIGKILL it, and the shim dies with torchrun (the same,
should its supervisor die and take torchrun with it); the shim then ends the way the child did
(same exit code, or the same signal), so torchrun sees exactly what the user's process did. A failing
child that wrote no torchelastic error file gets one, holding the exception and traceback found in its
log, so torchrun's own summary shows them too. Stdlib only; a file of its own (torchrun runs it by path).
"""

import json
import os
import re
import signal
import sys
import time

RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
TAIL = 64 * 1024


def write_json_atomic(path, obj):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def last_exception(log, since):
    """(message, traceback) of the last Python traceback the child printed, or ("", "")."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(since, os.fstat(fh.fileno()).st_size - TAIL))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return "", ""
    # torch.distributed prefixes what a rank prints to stderr with "[rankN]:" once its group exists
    lines = [RANK_PREFIX.sub("", line, count=1) for line in text.split("\n")]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return "", ""
    block = lines[starts[-1]:]
    while block and not block[-1].strip():
        block.pop()
    end = next((i for i in range(1, len(block)) if block[i] and not block[i].startswith((" ", "\t"))), None)
    if end is None:
        return "", ""
    return block[end].strip()[:2000], "\n".join(block[:end + 1])[-8000:]


def write_error_file(path, message, trace):
    """torch's elastic error file (ErrorHandler.record_exception's format), unless the worker wrote one."""
    if not path or os.path.exists(path):
        return
    try:
        write_json_atomic(path, {"message": {"message": message, "extraInfo": {
            "py_callstack": trace, "timestamp": str(int(time.time()))}}})
    except OSError:
        pass


def die_with_parent():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, ImportError):
        pass


def main(argv):
    die_with_parent()  # torchrun gone (SIGKILLed with its supervisor): so is this shim, and its child with it
    run_dir, entry = argv[1], argv[3:]
    rank, restart = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    workers = os.path.join(run_dir, "workers")
    os.makedirs(workers, 0o700, exist_ok=True)
    log = os.path.join(run_dir, "rank-%d.log" % rank)
    since = _output_to(log)
    started = time.time()
    write_json_atomic(os.path.join(workers, "rank-%d.json" % rank), {
        "rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "restart": restart, "pid": os.getpid(),
        "pgid": os.getpgid(0), "ticks": start_ticks(os.getpid()), "started_at": started})
    pid = _spawn(_bootstrapped(run_dir, rank, entry))
    forwarded = _forward_signals(pid)
    code = _wait_exit_code(pid)
    message, trace = ("", "")
    if code != 0:
        message, trace = last_exception(log, since)
        write_error_file(os.environ.get("TORCHELASTIC_ERROR_FILE"), message or "exit code %d" % code, trace)
    write_json_atomic(os.path.join(workers, "rank-%d.result" % rank), {
        "rank": rank, "restart": restart, "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else None, "stopped": bool(forwarded), "error": message, "traceback": trace,
        "started_at": started, "ended_at": time.time()})
    if code < 0:  # end the way the child did, so torchrun sees the same signal
        _die_by(-code)
    return code if code >= 0 else 128 - code


def _output_to(log):
    """This process's stdout and stderr (and so the child's) appended to the log; the log's size before."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    since = os.fstat(fd).st_size
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return since


def _bootstrapped(run_dir, rank, entry):
    """`bootstrap.py STACKS TRACER ENTRY...` (stacks on a signal: bootstrap.py), TRACER the supervisor's pid."""
    if not entry or (entry[0].startswith("-") and entry[0] not in ("-m", "-c")):
        return list(entry)
    boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")
    try:
        with open(os.path.join(run_dir, "state.json")) as fh:
            tracer = int(json.load(fh)["supervisor"]["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        tracer = 0
    return [boot, os.path.join(run_dir, "stacks", "rank-%d" % rank), str(tracer)] + list(entry)


def _spawn(entry):
    """The child that runs `python -u ENTRY...`; it dies with this process."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        die_with_parent()
        if os.getppid() != parent:
            os._exit(137)
        try:
            os.execv(sys.executable, [sys.executable, "-u"] + entry)
        except OSError as exc:
            os.write(2, ("clusterrun: cannot run %s: %s\n" % (sys.executable, exc)).encode())
            os._exit(127)
    return pid


def _forward_signals(pid):
    """Pass FORWARDED signals on to the child; the list of those that came (any: the child was stopped)."""
    forwarded = []

    def forward(signum, frame):
        forwarded.append(signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    return forwarded


def _wait_exit_code(pid):
    """The child's exit code once it ended; minus the signal that ended it."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            status = 0
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else \
        (os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))


def _die_by(signum):
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
