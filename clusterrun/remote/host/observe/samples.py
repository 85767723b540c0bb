"""`samples TARGET INTERVAL COUNT [CLAIMS_DIR]`: this host's load and its ranks', sampled here from /proc, one
JSON line every INTERVAL seconds (COUNT lines; 0: until the controller goes away). TARGET is a run id (RUN or
RUN/attempt-K) or "-" (the host alone, which clusterrun runs of this user hold it, and with CLAIMS_DIR every
user's live claims and queue entries there, share/claims.py). What `clusterrun top` shows.

  {"now": T, "interval": S,
   "host": {"cpu_pct": P, "cores": N, "load1": L, "mem_used": B, "mem_total": B, "net_rx": B/s, "net_tx": B/s,
            "gpus": [{"index", "util_pct", "mem_used", "mem_total"}] or null (no nvidia-smi)},
   "ranks": [{"rank", "state": running|ended|pending, "pid", "cpu_pct", "rss", "rss_children", "children",
              "last_output_s"}],
   "runs": [RUN...],                                     ("-": the runs whose supervisor runs here)
   "claims": [{"kind": claim|queue, "user", "by", "run", "slots", "gpus", "since", "state", ...}]}  ("-", CLAIMS_DIR)

CPU: of all cores together from /proc/stat deltas (100 = every core busy); a rank's is its process and
every process under it from /proc/PID/stat deltas, in % of one core (as `top` counts). Memory used is
MemTotal - MemAvailable. Network: every interface but lo, from /proc/net/dev deltas. last_output_s: now
minus the mtime of the rank's log. GPUs: `nvidia-smi --query-gpu=index,utilization.gpu,memory.used,
memory.total --format=csv,noheader,nounits` where it exists (memory in MiB there, bytes here). In a
container, /proc/stat and /proc/meminfo are the machine's, not the container's share.
"""

import os
import shutil
import subprocess
import sys
import time

from ..stdlib import json
from ..files import read_json
from ..paths import attempt_dirs, log_path, run_dir_of
from ..procs import same_process
from .state import load_state, rank_ids
from .stacks import descendants, process_table

NVIDIA_SMI = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
              "--format=csv,noheader,nounits"]
MIB = 1 << 20
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def cmd_samples(workdir, target, interval, count, claims_dir=""):
    run_dir = None if target == "-" else run_dir_of(workdir, target)
    interval, count = max(0.1, float(interval)), int(count)
    sampler = Sampler(workdir, run_dir, claims_dir if run_dir is None else "")
    sampler.take()
    sent = 0
    while not count or sent < count:
        time.sleep(interval)
        try:
            sys.stdout.write(json.dumps(sampler.take()) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:  # the controller went away: so do we
            return 0
        sent += 1
    return 0


class Sampler:
    """Keeps the last sample's counters; each `take` returns the rates since then."""

    def __init__(self, workdir, run_dir, claims_dir=""):
        self.workdir, self.run_dir, self.claims_dir = workdir, run_dir, claims_dir
        self.last = None  # (time, cpu, net, {pid: cpu ticks})
        self.gpu_tool = shutil.which("nvidia-smi")

    def take(self):
        now = time.time()
        cpu, net = read_cpu(), read_net()
        table = process_table()
        ranks = self.rank_processes(table)
        ticks = {pid: process_ticks(pid) for proc in ranks.values() if not isinstance(proc, str)
                 for pid in [proc[0]] + proc[1]}
        last, self.last = self.last, (now, cpu, net, ticks)
        dt = now - last[0] if last else 0.0
        host = {"cpu_pct": cpu_pct(last[1], cpu) if last else None, "cores": os.cpu_count(),
                "load1": load1(), "gpus": self.gpus()}
        host.update(memory())
        host.update(net_rates(last[2], net, dt) if last else {"net_rx": None, "net_tx": None})
        sample = {"now": now, "interval": round(dt, 3), "host": host, "ranks": self.ranks(ranks, ticks, last, now)}
        if self.run_dir is None:
            sample["runs"] = running_runs(self.workdir)
            if self.claims_dir:
                sample["claims"] = live_claims(self.claims_dir)
        return sample

    def rank_processes(self, table):
        """rank -> (pid, [pids under it]) of the run's ranks that run; ranks that do not: rank -> state."""
        if self.run_dir is None:
            return {}
        spec, state = load_state(self.run_dir, must_exist=False)
        if spec is None:
            return {}
        out = {}
        infos = (state or {}).get("ranks") or {}
        for rank in rank_ids(spec, state):
            info = infos.get(str(rank)) or {}
            if os.path.exists(os.path.join(self.run_dir, "rank-%d.exit" % rank)):
                out[rank] = "ended"
            elif not same_process(info.get("pid"), info.get("ticks")):
                out[rank] = "pending" if not info else "ended"
            else:
                out[rank] = (info["pid"], descendants(info["pid"], table))
        return out

    def ranks(self, ranks, ticks, last, now):
        out = []
        for rank, proc in sorted(ranks.items()):
            entry = {"rank": rank, "state": proc if isinstance(proc, str) else "running",
                     "last_output_s": last_output(log_path(self.run_dir, rank), now)}
            if not isinstance(proc, str):
                pid, children = proc
                entry.update(pid=pid, children=len(children), rss=rss(pid),
                             rss_children=sum(rss(c) or 0 for c in children),
                             cpu_pct=tree_cpu([pid] + children, ticks, last) if last else None)
            out.append(entry)
        return out

    def gpus(self):
        if self.gpu_tool is None:
            return None
        try:
            done = subprocess.run([self.gpu_tool] + NVIDIA_SMI[1:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return parse_nvidia_smi(done.stdout.decode("utf-8", "replace")) if done.returncode == 0 else None


def parse_nvidia_smi(text):
    """`index, utilization.gpu, memory.used, memory.total` lines (MiB) → [{index, util_pct, mem_used,
    mem_total}] in bytes; a field nvidia-smi cannot tell ("[N/A]", "[Not Supported]") is None."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            continue
        index, util, used, total = [_number(f) for f in fields]
        gpus.append({"index": int(index) if index is not None else len(gpus), "util_pct": util,
                     "mem_used": int(used * MIB) if used is not None else None,
                     "mem_total": int(total * MIB) if total is not None else None})
    return gpus


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def read_cpu(path="/proc/stat"):
    """(busy, total) jiffies of all cores together."""
    try:
        with open(path) as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return (0, 0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is counted in user already
    return (total - idle, total)


def cpu_pct(before, after):
    busy, total = after[0] - before[0], after[1] - before[1]
    return round(100.0 * busy / total, 1) if total > 0 else None


def load1(path="/proc/loadavg"):
    try:
        with open(path) as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def memory(path="/proc/meminfo"):
    values = {}
    try:
        with open(path) as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total, avail = values.get("MemTotal"), values.get("MemAvailable")
    return {"mem_total": total, "mem_used": total - avail if total is not None and avail is not None else None}


def read_net(path="/proc/net/dev"):
    """(rx bytes, tx bytes) over every interface but lo."""
    rx = tx = 0
    try:
        with open(path) as fh:
            for line in fh.readlines()[2:]:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if name.strip() != "lo" and len(fields) >= 9:
                    rx, tx = rx + int(fields[0]), tx + int(fields[8])
    except (OSError, ValueError):
        pass
    return (rx, tx)


def net_rates(before, after, dt):
    if dt <= 0:
        return {"net_rx": None, "net_tx": None}
    return {"net_rx": round(max(0, after[0] - before[0]) / dt), "net_tx": round(max(0, after[1] - before[1]) / dt)}


def process_ticks(pid):
    """utime + stime of pid, in clock ticks (None when gone)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        fields = data[data.rindex(b")") + 2:].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def tree_cpu(pids, ticks, last):
    """% of one core the processes used since the last sample (a process new since then: all of its time)."""
    dt = time.time() - last[0]
    used = 0
    for pid in pids:
        now_t, then_t = ticks.get(pid), last[3].get(pid)
        if now_t is not None:
            used += now_t - (then_t if then_t is not None and then_t <= now_t else 0)
    return round(100.0 * used / TICKS / dt, 1) if dt > 0 else None


def rss(pid):
    try:
        with open("/proc/%d/statm" % pid, "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def last_output(path, now):
    try:
        return round(max(0.0, now - os.path.getmtime(path)), 1)
    except OSError:
        return None


def live_claims(claims_dir):
    """Every user's live claims and queue entries in the claims folder (read only: nothing pruned)."""
    from ..share.claims import Folder, brief

    folder = Folder(claims_dir)
    return [brief(e) for e in folder.entries(prune=False) if e["live"]] if os.path.isdir(folder.path) else []


def running_runs(workdir):
    """The runs (RUN or RUN/attempt-K) whose supervisor runs on this host."""
    runs = os.path.join(workdir, "runs")
    try:
        names = sorted(os.listdir(runs))
    except OSError:
        return []
    found = []
    for name in names:
        folder = os.path.join(runs, name)
        for run_dir in [folder] + attempt_dirs(folder):
            sup = (read_json(os.path.join(run_dir, "state.json")) or {}).get("supervisor") or {}
            if sup.get("pid") and same_process(sup["pid"], sup.get("ticks")):
                found.append(os.path.relpath(run_dir, runs))
    return found
