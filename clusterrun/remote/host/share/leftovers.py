"""Leftovers: the processes that hold this host's GPU devices, each labelled, and the one way clusterrun
ever kills them (exactly an ended run's own marked processes).

A crashed job's DataLoader workers, or a child that left its rank's process group (setsid, a daemon),
keep a GPU's memory after the run; the next run OOMs on that GPU and nobody knows whose process it is.
Every rank of a clusterrun run carries the process marker (procs.MARKER_ENV: `RUN[/attempt-K]/NODE`) in
its environment, and its children inherit it, so a holder is labelled by it:

  this-run   the marker of the run that asks (a launch's preflight on its own run: nothing to fix)
  ended-run  a marker whose attempt folder here has no live supervisor: `clusterrun clean --leftovers RUN`
  live-run   a marker of a run whose supervisor still runs (another run of this user)
  claim      another user's process, that user holding a live claim here (share/claims.py)
  unknown    anything else: pid, user and command are shown, and clusterrun never touches it

Only this login's processes show their fds and environment (/proc), unless it is root; another user's
holders are found through `nvidia-smi --query-compute-apps` where it lists them.

Protocol (`leftovers`, one JSON request on stdin, one JSON line answered):
  request  {"devices": glob of the device files (default /dev/nvidia*), "run": the asking run's id or "",
            "claims_dir": DIR or "", "kill": RUN | "*" (every ended run) | "" (list only), "grace": s}
  answer   {"holders": [{"pid", "uid", "user", "command", "devices", "gpus", "label", "run", "node",
            "mem_mib"}], "killed": [pids], "hidden": processes whose fds this login could not read}
"""

import fnmatch
import os
import pwd
import re
import subprocess
import sys
import time

from ..stdlib import json
from ..stdlib import signal
from ..files import read_json
from ..paths import run_dir_of
from ..procs import MARKER_ENV, same_process, start_ticks

DEVICES = "/dev/nvidia*"
APPS = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
_GPU_DEV = re.compile(r"(\d+)$")


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return ""


def _marker(pid):
    """The process's clusterrun marker ("" when none, or its environment is not ours to read)."""
    prefix = ("%s=" % MARKER_ENV).encode()
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(prefix):
                    return item[len(prefix):].decode("utf-8", "replace")
    except OSError:
        pass
    return ""


def open_devices(pattern):
    """({pid: sorted device paths it holds open}, how many processes' fds could not be read)."""
    found, hidden = {}, 0
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        fd_dir = "/proc/%s/fd" % name
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            hidden += 1
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if fnmatch.fnmatch(target, pattern):
                found.setdefault(int(name), set()).add(target)
    return dict((pid, sorted(paths)) for pid, paths in found.items()), hidden


def compute_apps(timeout=10.0):
    """{pid: MiB of GPU memory} from nvidia-smi ({} where there is none, or it fails)."""
    try:
        done = subprocess.run(APPS, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            try:
                out[int(parts[0])] = out.get(int(parts[0]), 0.0) + float(parts[1])
            except ValueError:
                continue
    return out


def split_marker(marker):
    """RUN[/attempt-K]/NODE → (run id, attempt key, node)."""
    parts = marker.split("/")
    if len(parts) < 2:
        return marker, marker, ""
    return parts[0], "/".join(parts[:-1]), parts[-1]


def attempt_live(workdir, key):
    """Whether the attempt's supervisor still runs here (False for a folder that is gone)."""
    try:
        folder = run_dir_of(workdir, key)
    except Exception:  # a marker that is no run id of ours
        return False
    sup = (read_json(os.path.join(folder, "state.json")) or {}).get("supervisor") or {}
    return same_process(sup.get("pid"), sup.get("ticks"))


def label(holder, asking_run, live, claim_users):
    """One holder's label (see the module docstring); pure: live(attempt key) says a supervisor runs,
    claim_users: {uid: run id} of live claims here."""
    if holder.get("marker"):
        run, key, _ = split_marker(holder["marker"])
        if asking_run and run == asking_run:
            return "this-run"
        return "live-run" if live(key) else "ended-run"
    if holder.get("uid") is not None and holder["uid"] != os.getuid() and holder["uid"] in claim_users:
        return "claim"
    return "unknown"


def _claim_users(claims_dir):
    """{uid: run} of the live claims in the claims folder (the rule's own reading: share/claims.py)."""
    if not claims_dir:
        return {}
    from .claims import Folder

    out = {}
    for entry in Folder(claims_dir).entries(prune=False):
        if entry.get("kind") == "claim" and entry.get("live", True) and entry.get("uid") is not None:
            out[int(entry["uid"])] = entry.get("run", "")
    return out


def _uid(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


def scan(workdir, request):
    """Every holder of the request's device files, labelled; and how many processes were hidden."""
    pattern = request.get("devices") or DEVICES
    held, hidden = open_devices(pattern)
    mem = compute_apps() if pattern == DEVICES else {}
    claim_users = _claim_users(request.get("claims_dir") or "")
    holders = []
    for pid in sorted(set(held) | set(mem)):
        uid = _uid(pid)
        if uid is None:
            continue
        marker = _marker(pid)
        run, _, node = split_marker(marker) if marker else ("", "", "")
        h = {"pid": pid, "ticks": start_ticks(pid), "uid": uid, "user": _user(uid), "command": _cmdline(pid),
             "devices": held.get(pid, []), "marker": marker, "run": run, "node": node, "mem_mib": mem.get(pid),
             "gpus": sorted(set(int(m.group(1)) for m in (_GPU_DEV.search(d) for d in held.get(pid, [])) if m))}
        h["label"] = label(h, request.get("run") or "", lambda key: attempt_live(workdir, key), claim_users)
        if h["label"] == "claim":
            h["run"] = claim_users.get(uid, "")
        holders.append(h)
    return holders, hidden


def killable(holder, run):
    """Exactly what `clean --leftovers` may kill: this user's own process, marked by an ended run (the one
    named, or any for "*"). Never another user's, never an unmarked process, never a live run's."""
    return holder["label"] == "ended-run" and holder["uid"] == os.getuid() and bool(holder.get("marker")) and \
        (run == "*" or holder["run"] == run)


def kill(holders, run, grace):
    """TERM the killable holders, KILL what is left after grace; each checked by pid + start time first."""
    targets = [h for h in holders if killable(h, run)]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        for h in targets:
            if same_process(h["pid"], h["ticks"]):
                try:
                    os.kill(h["pid"], sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.time() + wait
        while time.time() < deadline and any(same_process(h["pid"], h["ticks"]) for h in targets):
            time.sleep(0.05)
    return [h["pid"] for h in targets]


def cmd_leftovers(workdir):
    from ..wire import reply

    request = json.loads(sys.stdin.buffer.read().decode() or "{}")
    holders, hidden = scan(workdir, request)
    killed = kill(holders, request["kill"], float(request.get("grace", 3.0))) if request.get("kill") else []
    reply({"holders": holders, "killed": killed, "hidden": hidden})
    return 0
