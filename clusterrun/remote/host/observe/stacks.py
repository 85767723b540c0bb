"""`stacks RUN [--rank R]... [--via auto|py-spy|faulthandler]`: the Python stack of every thread of every
rank of the run on this host, and of the processes each rank started (DataLoader workers, mp.spawn's),
as one JSON line:

  {"now": T, "ranks": [{"rank": R, "pid": P, "state": "running"|"ended"|"not-started", "via": HOW,
                        "threads": [THREAD...], "children": [{"pid": P, "via": HOW, "threads": [...],
                        "error": TEXT}], "error": TEXT}]}
  THREAD = {"name": N, "id": "0x...", "main": BOOL, "frames": [{"function": F, "file": PATH, "line": L}]}
  frames innermost first; HOW is "py-spy" or "faulthandler" (what produced that process's stack).

Two ways to read a live process's stack, tried in this order for each process (--via picks one):
  py-spy      where the host has it (on PATH, or beside this Python) and may attach (ptrace: a container
              without it, or Yama's ptrace_scope 1 for a py-spy that is not the supervisor's: see
              run/bootstrap.py, refuse); `py-spy dump --pid P --json`, every process at once.
  faulthandler  the bootstrap every rank runs (run/bootstrap.py) registered faulthandler on a real-time
              signal, into RUN/stacks/rank-R (RUN/stacks/rank-R.PID for a process it forked). The signal
              goes only to a process whose /proc status says it catches that signal and whose file's
              header names it (a process that exec'd, or was spawned, does not: it would die of it);
              then the file's new bytes are parsed.
The same collection serves the hang watch (run/hang.py), inside the supervisor: a py-spy started there
is the supervisor's child, which a rank allows under Yama.
"""

import os
import re
import shutil
import subprocess
import sys
import time

from ..stdlib import json
from ..files import open_regular, read_capped, regular_size
from ..paths import log_path, stacks_file
from ..procs import same_process
from .state import collect_exits, load_state, rank_ids
from ..wire import reply

# by the end of its path: a run started by another version of this program runs that version's bootstrap
# (installed: WORKDIR/bin/host-ID/clusterrun_host/...; in clusterrun's source tree: .../remote/host/...)
BOOTSTRAPS = ("/clusterrun_host/run/bootstrap.py", "/clusterrun/remote/host/run/bootstrap.py")
# the frames it runs in: the script's and its body's (bootstrap_body.py), which it runs from the bytecode cache
BOOTSTRAP_FRAMES = BOOTSTRAPS + tuple(p[:-3] + "_body.py" for p in BOOTSTRAPS)
HEADER = re.compile(r"^clusterrun-stacks pid=(\d+) main=(0x[0-9a-fA-F]+) signal=(\d+)$")
THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):$")
FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
SETTLE = 0.03  # a dump's file stopped growing this long ago: it is complete
# How long the ranks get to answer. The wait ends as soon as every dump is in (faulthandler writes from its
# signal handler, at the rank's next time on a CPU), so this is only ever waited out for a rank that does not
# answer; on a loaded host (a hundred ranks and their host programs on two cores) 3 s was too short.
DUMP_TIMEOUT = 10.0
MAX_THREADS = 64
MAX_FRAMES = 64
MAX_CHILDREN = 32
DUMP_CAP = 1 << 20  # of one dump's bytes: past MAX_THREADS * MAX_FRAMES lines there is nothing to keep
VIAS = ("auto", "py-spy", "faulthandler")


def cmd_stacks(run_dir, *args):
    ranks, via = _options(args)
    spec, state = load_state(run_dir)
    if spec is None:
        reply({"now": time.time(), "ranks": [], "started": False})
        return 0
    exits, _ = collect_exits(run_dir, spec, state)
    wanted = [r for r in rank_ids(spec, state) if not ranks or r in ranks]
    reply({"now": time.time(), "started": True, "ranks": collect(run_dir, state, exits, wanted, via)})
    return 0


def _options(args):
    ranks, via = set(), "auto"
    args = list(args)
    while args:
        flag = args.pop(0)
        if flag == "--rank" and args:
            ranks.add(int(args.pop(0)))
        elif flag == "--via" and args and args[0] in VIAS:
            via = args.pop(0)
    return ranks, via


# -------------------------------------------------------------- processes


def process_table():
    """{pid: parent pid} of every process here (one read of /proc)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
            table[int(name)] = int(data[data.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(pid, table):
    """Every process below pid, breadth first (nearest first)."""
    children = {}
    for child, parent in table.items():
        children.setdefault(parent, []).append(child)
    out, todo = [], list(sorted(children.get(pid, ())))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(sorted(children.get(p, ())))
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def is_bootstrap(path):
    return path.endswith(BOOTSTRAPS)


def runs_bootstrap(pid):
    return any(is_bootstrap(arg.decode("utf-8", "replace")) for arg in cmdline(pid)[1:3])


def rank_process(pid, table):
    """The process that runs the rank's entry: pid itself, or (torchrun's worker shim) its first
    descendant that runs the bootstrap."""
    if runs_bootstrap(pid):
        return pid
    return next((p for p in descendants(pid, table) if runs_bootstrap(p)), pid)


def catches(pid, sig):
    """Whether pid has a handler for sig (SigCgt in /proc/PID/status): only then may it be sent."""
    try:
        with open("/proc/%d/status" % pid, "rb") as fh:
            for line in fh:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def process_state(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:].split()[0].decode()
    except (OSError, ValueError, IndexError):
        return "gone"


# -------------------------------------------------------------- faulthandler


def read_header(path):
    """(pid, main thread id, signal) from a stacks file's first line, or None."""
    try:  # the rank can write its stacks folder: what it put there must not stall us (files.open_regular)
        line = read_capped(path, 200).split(b"\n", 1)[0].decode("ascii", "replace").strip()
    except OSError:
        return None
    m = HEADER.match(line)
    return (int(m.group(1)), m.group(2).lower(), int(m.group(3))) if m else None


def parse_faulthandler(text, main_id=None):
    """faulthandler's dump (every thread) → THREADs, frames innermost first (as it prints them)."""
    threads = []
    for line in text.splitlines():
        m = THREAD.match(line)
        if m:
            ident = "0x%016x" % int(m.group(2), 16)
            main = main_id is not None and int(ident, 16) == int(main_id, 16)
            name = m.group(3) or ("MainThread" if main else "Thread %s" % ident)
            threads.append({"name": name, "id": ident, "main": main, "frames": []})
            continue
        f = FRAME.match(line)
        if f and threads and len(threads[-1]["frames"]) < MAX_FRAMES:
            threads[-1]["frames"].append({"function": f.group(3), "file": f.group(1), "line": int(f.group(2))})
    if threads and not any(t["main"] for t in threads) and main_id is None:
        threads[-1]["main"] = True  # faulthandler lists the main thread last
    return [_without_bootstrap(t) for t in threads[:MAX_THREADS]]


def _without_bootstrap(thread):
    """The bootstrap's own frames (outermost, below the entry's <module>) are not the rank's."""
    thread["frames"] = [f for f in thread["frames"] if not f["file"].endswith(BOOTSTRAP_FRAMES)]
    return thread


def faulthandler_dumps(targets, deadline):
    """{pid: (threads, error)} for targets [(pid, path)]: signal each (if it may be), read what it wrote."""
    sent, out = {}, {}
    for pid, path in targets:
        header = read_header(path)
        if header is None or header[0] != pid:
            out[pid] = ([], "no stacks file from clusterrun's bootstrap (a process it did not start?)")
        elif not catches(pid, header[2]):
            out[pid] = ([], "it does not catch the dump signal (it exec'd, or reset its handlers)")
        else:
            size = _size(path)
            try:
                os.kill(pid, header[2])
                sent[pid] = [path, size, header[1], None]  # path, size before, main thread, last growth
            except OSError as exc:
                out[pid] = ([], "cannot signal it: %s" % exc.strerror)
    _await_dumps(sent, deadline)
    for pid, (path, before, main, grew) in sent.items():
        if grew is None:
            out[pid] = ([], "no dump came (process state %s)" % process_state(pid))
        else:
            out[pid] = (parse_faulthandler(_read_from(path, before), main), "")
    return out


def _await_dumps(sent, deadline):
    """Until every signalled process's file grew and then stood still for SETTLE seconds (or the deadline)."""
    while time.time() < deadline:
        now = time.time()
        for entry in sent.values():
            size = _size(entry[0])
            if size > entry[1] and (entry[3] is None or size != entry[3][0]):
                entry[3] = (size, now)
        if all(e[3] is not None and now - e[3][1] >= SETTLE for e in sent.values()):
            return
        time.sleep(0.005)


_size = regular_size


def _read_from(path, offset):
    try:
        return read_capped(path, DUMP_CAP, offset).decode("utf-8", "replace")
    except OSError:
        return ""


# -------------------------------------------------------------- py-spy


def py_spy():
    """The py-spy to use: on PATH, or beside the Python running this program (a venv's bin); or None."""
    found = shutil.which("py-spy")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return found or (beside if os.access(beside, os.X_OK) else None)


def parse_py_spy(data, pid):
    """`py-spy dump --json` → THREADs of pid (frames innermost first, as py-spy gives them)."""
    threads = []
    for t in json.loads(data.decode("utf-8", "replace")) if data.strip() else []:
        if not isinstance(t, dict) or t.get("pid", pid) != pid:
            continue
        ident = "0x%016x" % int(t.get("thread_id") or 0)
        main = t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread"
        frames = [{"function": str(f.get("name")), "file": str(f.get("filename")), "line": int(f.get("line") or 0)}
                  for f in (t.get("frames") or [])[:MAX_FRAMES] if isinstance(f, dict)]
        threads.append({"name": t.get("thread_name") or "Thread %s" % ident, "id": ident, "main": bool(main),
                        "frames": frames})
    return [_without_bootstrap(t) for t in threads[:MAX_THREADS]]


def py_spy_dumps(exe, pids, deadline):
    """{pid: (threads, error)}: one `py-spy dump` per process, all at once."""
    procs, out = {}, {}
    for pid in pids:
        try:
            procs[pid] = subprocess.Popen([exe, "dump", "--pid", str(pid), "--json"], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            out[pid] = ([], "py-spy: %s" % exc.strerror)
    for pid, proc in procs.items():
        try:
            data, err = proc.communicate(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child
            proc.communicate()
            out[pid] = ([], "py-spy: no answer in time")
            continue
        if proc.returncode != 0:
            last = (err.decode("utf-8", "replace").strip().splitlines() or ["exit %d" % proc.returncode])[-1]
            out[pid] = ([], "py-spy: %s" % last[:300])
            continue
        try:
            out[pid] = (parse_py_spy(data, pid), "")
        except (ValueError, TypeError) as exc:
            out[pid] = ([], "py-spy: unreadable answer (%s)" % exc)
    return out


# -------------------------------------------------------------- every rank


def targets_of(run_dir, state, exits, ranks, table):
    """rank -> (main process, [its descendants]) for the ranks that run; others -> why not."""
    out = {}
    infos = (state or {}).get("ranks") or {}
    for rank in ranks:
        info = infos.get(str(rank))
        if rank in exits:
            out[rank] = "ended"
        elif not info or not same_process(info.get("pid"), info.get("ticks")):
            out[rank] = "not-started" if not info else "ended"
        else:
            main = rank_process(info["pid"], table)
            out[rank] = (main, descendants(main, table)[:MAX_CHILDREN])
    return out


def dump_all(run_dir, processes, via, deadline):
    """{pid: (threads, how, error)} for processes {pid: (rank, its main process)}: py-spy first where the
    host has it (--via auto), faulthandler for what it could not read."""
    exe = py_spy() if via != "faulthandler" else None
    if via == "py-spy" and exe is None:
        return {pid: ([], "", "py-spy is not on this host (PATH, or beside %s)" % sys.executable)
                for pid in processes}
    results = _by_py_spy(exe, processes, deadline) if exe is not None else {}
    if via == "py-spy":
        return results
    rest = [(pid, _file_for(run_dir, processes[pid], pid)) for pid in processes
            if pid not in results or results[pid][2]]
    for pid, (threads, error) in faulthandler_dumps(rest, deadline).items():
        tried = results.get(pid, ([], "", ""))[2]
        results[pid] = (threads, "faulthandler", "") if threads else \
            ([], "", "; ".join(e for e in (tried, error) if e))
    return results


def _by_py_spy(exe, processes, deadline):
    """py-spy gets at most two thirds of the time: faulthandler may still answer for what it could not read."""
    spy_deadline = min(deadline, time.time() + (deadline - time.time()) * 2 / 3)
    return {pid: (threads, "" if error else "py-spy", error)
            for pid, (threads, error) in py_spy_dumps(exe, sorted(processes), spy_deadline).items()}


def _file_for(run_dir, owner, pid):
    rank, main = owner
    return stacks_file(run_dir, rank) if pid == main else stacks_file(run_dir, rank, pid)


def collect(run_dir, state, exits, ranks, via="auto", timeout=DUMP_TIMEOUT):
    """Every rank's entry (see the protocol above), gathered in one pass over all of them."""
    deadline = time.time() + timeout
    targets = targets_of(run_dir, state, exits, ranks, process_table())
    processes = {}
    for rank, target in targets.items():
        if isinstance(target, tuple):
            for pid in [target[0]] + target[1]:
                processes[pid] = (rank, target[0])
    dumps = dump_all(run_dir, processes, via, deadline) if processes else {}
    return [_entry(rank, targets[rank], dumps) for rank in ranks]


def _entry(rank, target, dumps):
    if not isinstance(target, tuple):
        return {"rank": rank, "pid": None, "state": target, "via": "", "threads": [], "children": [], "error": ""}
    main, children = target
    threads, how, error = dumps.get(main, ([], "", "no answer"))
    kids = []
    for pid in children:
        t, h, e = dumps.get(pid, ([], "", "no answer"))
        kids.append({"pid": pid, "name": _comm(pid), "via": h, "threads": t, "error": e})
    return {"rank": rank, "pid": main, "state": "running", "via": how, "threads": threads, "children": kids,
            "error": error}


def _comm(pid):
    try:
        with open("/proc/%d/comm" % pid, "rb") as fh:
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def main_frames(entry):
    """The frames of a rank entry's main thread ([] when there are none)."""
    return next((t["frames"] for t in entry.get("threads") or () if t.get("main")), [])


def write_into_log(run_dir, rank, text):
    """A clusterrun note appended to the rank's own log (the hang watch: what the rank was doing)."""
    try:
        fd = open_regular(log_path(run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass
