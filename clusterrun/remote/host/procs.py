"""Which processes are ours: recorded pid + start time, process groups, and the run id in the
environment. Signals go only to processes that pass these checks - never to a name or pattern."""

import os
import time

from .stdlib import signal


def _stat(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:].split()
    except (OSError, ValueError):
        return None


def start_ticks(pid):
    """Process start time in clock ticks since boot (None if gone or no /proc): tells pid reuse apart."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


def same_process(pid, ticks):
    """True if pid is alive (a zombie is not: it has ended, nobody reaped it yet) and is the process
    recorded with these start ticks."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    fields = _stat(pid)
    if fields is not None and fields[0] == b"Z":
        return False
    now = start_ticks(pid)
    if now is None or ticks is None:
        return not os.path.exists("/proc/self/stat")  # no /proc: best effort on the pid alone
    return now == ticks


def exists(pid, ticks):
    """same_process for anyone's process: /proc/PID/stat is readable for every user's (a signal is not),
    so another user's recorded process can be told alive or gone. None where /proc hides other users'
    processes (mounted hidepid) and pid is not ours to see: nobody can tell."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    fields = _stat(pid)
    if fields is None:
        if not os.path.exists("/proc/self/stat"):  # no /proc at all: the pid alone (a signal 0 tells)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass
            return True
        if not os.path.exists("/proc/1/stat"):
            return None  # hidepid: pid 1 is root's and hidden, so other users' are too
        return False
    if fields[0] == b"Z":
        return False
    try:
        return ticks is None or int(fields[19]) == ticks
    except (ValueError, IndexError):
        return False


def owner_uid(pid):
    """The real uid pid runs as (/proc/PID/status), or None when it is gone or hidden from this user."""
    try:
        with open("/proc/%d/status" % pid, "rb") as fh:
            for line in fh.read(1 << 16).splitlines():
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


MARKER_ENV = "CLUSTERRUN_PROCESS"


def attempt_key(spec):
    """RUN, or RUN/attempt-K: which attempt of which run a spec starts (specs written before the key had
    its own field carried it as run_id)."""
    return spec.get("attempt_key") or spec["run_id"]


def process_marker(spec):
    """What every process of one attempt of a run on one host carries in its environment: the attempt key
    and the node's name, so that two nodes of one run on one machine never take each other's processes
    for their own."""
    return "%s/%s" % (attempt_key(spec), spec.get("node", ""))


def run_members(marker):
    """Pids of this user's processes whose environment carries this marker (catches setsid escapees)."""
    marker = ("%s=%s" % (MARKER_ENV, marker)).encode()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def end_members(marker, grace):
    """TERM this user's processes that carry the marker, KILL those left after grace (each by pid and
    start time, so a pid reused meanwhile is never signalled); the pids found. For what left its rank's
    process group (setsid, a daemonized DataLoader worker) and so escaped the group's signals."""
    from .stdlib import signal

    found = [(pid, start_ticks(pid)) for pid in run_members(marker)]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        live = [(pid, ticks) for pid, ticks in found if same_process(pid, ticks)]
        for pid, _ in live:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + wait
        while live and time.time() < deadline and any(same_process(p, t) for p, t in live):
            time.sleep(0.05)
    return [pid for pid, _ in found]


def signal_rank(marker, info, sig):
    """Signal one rank's process group, if it is still ours; else its leftover members by run id."""
    pgid = info.get("pgid")
    if same_process(info.get("pid"), info.get("ticks")):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        return
    for pid in run_members(marker):
        try:
            if os.getpgid(pid) == pgid:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def rank_live(marker, info):
    if same_process(info.get("pid"), info.get("ticks")):
        return True
    pgid = info.get("pgid")
    for pid in run_members(marker):
        try:
            if os.getpgid(pid) == pgid:
                return True
        except ProcessLookupError:
            pass
    return False


_PRCTL = []  # libc's prctl, once found (death_signal_ready), or None where there is none


def death_signal_ready():
    """Find what die_with_parent calls (libc's prctl) in this process, once: children forked afterwards
    only call it. Through _ctypes, the C module alone (~0.8 ms of CPU): `import ctypes` adds ~4 ms of its
    Python layer, for one call with two ints. libc's prctl(option, arg), or None where it cannot be had
    (not Linux, no ctypes)."""
    if not _PRCTL:
        try:
            import _ctypes

            address = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")
            _PRCTL.append(lambda option, arg: _ctypes.call_function(address, (option, arg)))
        except (OSError, AttributeError, ImportError):  # (a Python without these internals: ctypes itself)
            try:
                import ctypes

                _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
            except (OSError, AttributeError, ImportError):
                _PRCTL.append(None)
    return _PRCTL[0]


def die_with_parent(parent=None):
    """For a child between fork and exec (preexec_fn): the kernel kills it when its parent, the supervisor,
    dies (PR_SET_PDEATHSIG), so a supervisor that dies leaves its ranks stopped, not orphaned. Linux
    only; elsewhere nothing happens (the next host-program call for the run then stops what is left).
    parent: the pid it was forked from. One that died before the death signal was set up sends none (the
    child has been handed to init or a subreaper by then), so the child checks and ends itself."""
    prctl = death_signal_ready()
    if prctl is not None:
        try:
            prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
        except (OSError, TypeError, ValueError):
            pass
    if parent is not None and os.getppid() != parent:
        os._exit(137)  # as if the death signal had come: 128 + SIGKILL


def rank_child(parent):
    """preexec_fn of a rank's process (or torchrun's) forked by the supervisor `parent`: it dies with the
    supervisor (die_with_parent), and SIGHUP is back to its default: the supervisor ignores it, and an
    ignored signal stays ignored across exec, where the rank's own program expects the default."""
    die_with_parent(parent)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def kill_group(proc):
    """SIGKILL to a child started in a session of its own (its whole group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
