"""launcher torchrun on one host: one `python -m torch.distributed.run` whose workers are clusterrun's ranks.

torchrun's c10d rendezvous decides which global ranks a host gets, so they are learnt as the workers
start: torchrun runs every worker through the shim worker.py, which registers it and reports its end.

Files in the run folder (besides spec.json, state.json, rank-<R>.log, rank-<R>.exit, done.json):
  launcher.log                 torchrun's own output (rendezvous, restarts, its failure summary)
  torchelastic/                torchrun's --log-dir: the workers' error files
  workers/rank-<R>.json        a worker's registration: {rank, local_rank, restart, pid, pgid, ticks, started_at}
  workers/rank-<R>.result      how it ended: {rank, restart, exit_code, signal, stopped, error, traceback, ...}
state.json adds "launcher": {pid, pgid, ticks, started_at} and "restarts" (torchrun's restart count), and its
"ranks" grow as workers register. When torchrun ends, every rank of its last round gets its exit record;
if no worker ever started (rendezvous failed, torch missing), the ranks clusterrun expected here do.

Stopping: TERM to torchrun's process group (torchrun stops its workers, each in a session of its own),
then after the grace KILL to torchrun's group and to every registered worker's group.
"""

import functools
import os
import subprocess
import time

from ..stdlib import signal
from ..files import open_regular, read_capped, read_json, regular_size
from ..paths import job_dir
from ..procs import rank_child, same_process, start_ticks
from .supervisor import Supervisor

LAUNCHER_LOG = "launcher.log"
ELASTIC_DIR = "torchelastic"
TAIL = 16 * 1024


def launcher_error(run_dir):
    """The last meaningful line torchrun printed (its error), for ranks that never started."""
    path = os.path.join(run_dir, LAUNCHER_LOG)
    try:
        data = read_capped(path, TAIL, max(0, regular_size(path) - TAIL))
        lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors or lines or [""])[-1][:2000]


class TorchrunSupervisor(Supervisor):
    def __init__(self, run_dir, spec, wake_fd=None):
        Supervisor.__init__(self, run_dir, spec, wake_fd)
        self.proc = None
        self.launcher = {}
        self.restarts = 0
        self.workers = os.path.join(run_dir, "workers")

    def state(self):
        state = Supervisor.state(self)
        state.update({"launcher": self.launcher, "restarts": self.restarts})
        return state

    def start(self):
        expected = [r["rank"] for r in self.spec["ranks"]]
        if os.path.exists(os.path.join(self.run_dir, "stop.json")):
            for rank in expected:
                self.record(rank, stopped=True, error="stopped before it started")
            return
        os.makedirs(self.workers, 0o700, exist_ok=True)
        shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
        # torch's error files (they hold the failing worker's traceback) go under the run folder, where the
        # scrub finds them, not under /tmp
        argv = list(self.spec["command"]) + ["--log-dir", os.path.join(self.run_dir, ELASTIC_DIR), shim,
                                             self.run_dir, "--"] + list(self.spec["entry"])
        env = self.environment(self.spec["env"])
        fd = open_regular(os.path.join(self.run_dir, LAUNCHER_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            self.proc = subprocess.Popen(argv, cwd=job_dir(self.run_dir), env=env,
                                         stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                         close_fds=True,
                                         preexec_fn=functools.partial(rank_child, os.getpid()))
        except OSError as exc:
            os.write(fd, ("clusterrun: cannot start torchrun (%s): %s\n" % (argv[0], exc)).encode())
            for rank in expected:
                self.record(rank, exit_code=127, started_at=time.time(), error=str(exc))
            return
        finally:
            os.close(fd)
        self.launcher = {"pid": self.proc.pid, "pgid": self.proc.pid, "ticks": start_ticks(self.proc.pid),
                         "started_at": time.time()}

    def running(self):
        return self.proc is not None

    def register(self):
        """Take in workers that registered since the last look; rewrite state.json when there are new ones."""
        try:
            names = os.listdir(self.workers)
        except OSError:
            return
        changed = False
        for name in names:
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            reg = read_json(os.path.join(self.workers, name))
            if reg is None:
                continue
            key = str(reg["rank"])
            if self.ranks.get(key, {}).get("pid") != reg["pid"]:
                self.ranks[key] = {k: reg.get(k) for k in ("pid", "pgid", "ticks", "started_at", "local_rank",
                                                           "restart")}
                self.restarts = max(self.restarts, int(reg.get("restart") or 0))
                changed = True
        if changed:
            self.write_state()

    def poll(self, now):
        self.register()
        rc = self.proc.poll()
        if rc is None:
            return
        self.proc = None
        self.register()
        self.finish(rc, now)
        self.watch_group(self.launcher["pgid"], now)
        for info in self.ranks.values():
            if same_process(info.get("pid"), info.get("ticks")):
                self.watch_group(info["pgid"], now)

    def finish(self, rc, now):
        stopping = self.stopping_since is not None
        if not self.ranks:  # no worker ever started: the ranks expected here end with torchrun
            self._end_expected(rc, now, stopping)
            return
        for key, reg in sorted(self.ranks.items()):
            if int(reg.get("restart") or 0) != self.restarts:
                continue  # ran in an earlier round only (the world changed since)
            self._record_worker(key, reg, self._worker_result(key, stopping), now, stopping)

    def _end_expected(self, rc, now, stopping):
        """Every rank expected here ends as torchrun did, with torchrun's error."""
        error = launcher_error(self.run_dir) or "torchrun exited with %s" % rc
        for r in self.spec["ranks"]:
            self.record(r["rank"], exit_code=rc if rc >= 0 else None, signal=-rc if rc < 0 else None,
                        ended_at=now, started_at=self.launcher.get("started_at"), stopped=stopping,
                        error="" if rc == 0 else error)

    def _worker_result(self, key, stopping):
        """How a worker of the last round ended, by its own word; killed, where it said nothing."""
        res = read_json(os.path.join(self.workers, "rank-%s.result" % key)) or {}
        if int(res.get("restart", -1)) != self.restarts:
            res = {"exit_code": None, "signal": signal.SIGKILL, "stopped": stopping,
                   "error": "" if stopping else "the worker ended without a word (killed with torchrun?)"}
        return res

    def _record_worker(self, key, reg, res, now, stopping):
        stopped = res.get("exit_code") != 0 and (bool(res.get("stopped")) or stopping)
        self.record(int(key), exit_code=res.get("exit_code"), signal=res.get("signal"),
                    ended_at=res.get("ended_at", now), started_at=reg.get("started_at"), stopped=stopped,
                    error="" if stopped else res.get("error") or "", traceback=res.get("traceback") or "",
                    restarts=self.restarts, local_rank=reg.get("local_rank"))

    def groups(self, stopping):
        if self.proc is None:
            return []
        if stopping:  # torchrun stops its workers itself, in order
            return [self.launcher["pgid"]]
        return [self.launcher["pgid"]] + [info["pgid"] for info in self.ranks.values()
                                          if same_process(info.get("pid"), info.get("ticks"))]

