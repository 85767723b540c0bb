"""When a run ends: rank 0's host's supervisor runs the inventory's `notify:` commands (a webhook, a mail,
a desktop message), so they fire with nobody's laptop open.

What a command gets in its environment: the host's own, the spec's notify env (the host's env:,
CLUSTERRUN_RUN_ID, CLUSTERRUN_NODE_NAME, CLUSTERRUN_PYTHON), the run's secrets (a webhook's token), and
  CLUSTERRUN_STATE      succeeded | failed | timed-out | stopped | interrupted, as this host knows it
  CLUSTERRUN_EXIT_CODE  clusterrun's exit code for that state: 0, 1, 4 or 130
  CLUSTERRUN_REASON     one line: the first failure, the time limit, who stopped it ("" on success)
  CLUSTERRUN_ATTEMPT    which attempt ended (1: the first); CLUSTERRUN_FINAL=0 when a restart may follow

What this host can know (`verdict`): its own ranks' exit records, why its supervisor stopped them (the
time limit, a stop with its reason, a failure here), and what the other hosts' supervisors told it (their
first failure, a host gone silent). The controller's verdict (outcome.py) is made from the same facts of
every host, so the two agree, up to which of two failures at once counts as the first.

Each command runs with the user's login shell (as job.setup's), in the job folder, in a process group of
its own; its output is appended to notify.log in the attempt's folder with the secrets masked as it is
written; after timeouts.notify seconds its process group is killed, and so is anything it left behind:
in its group, and anywhere else by the process marker every command carries in its environment
(CLUSTERRUN_PROCESS=RUN/NODE/notify, procs.run_members), as `stop` finds a rank's escapees, so a
command that left its group (setsid, a daemon) does not outlive its deadline either.
The commands run after the run's exit records and done.json are written: whatever a command does (fail,
hang, print a secret), the run's result is already settled, and no reader of the run waits for it.
"""

import os
import select
import subprocess
import time

from ..stdlib import signal
from ..files import open_regular
from ..paths import job_dir
from ..procs import MARKER_ENV, process_marker, run_members
from ..secrets import Masker, secret_values
from ..shell import login_shell
from ..words import INTERRUPTED, how_it_ended, rank_failed, time_limit_reached

LOG = "notify.log"
LINGER = 1.0  # after a command exits, how long its output may still come (a child holding the pipe)

EXIT_CODES = {"succeeded": 0, "failed": 1, "stopped": 1, "timed-out": 4, "interrupted": 130}


def at_end(supervisor):
    """The supervisor's hook at its very end: run the notify commands, if this host has any. Nothing that
    happens here may change the run's result or end the supervisor with an error."""
    conf = supervisor.spec.get("notify") or {}
    if not conf.get("commands"):
        return
    try:
        elsewhere = getattr(supervisor.coordinator, "failure", None)
        state, reason = verdict(supervisor.exits, supervisor.stop_reason, elsewhere, supervisor.spec.get("node", ""),
                                conf.get("time_limit_s"))
        codes = run_all(supervisor.run_dir, supervisor.spec, conf, state, reason)
        supervisor.log("notify: %d command(s) ran for state %s: exit %s"
                       % (len(codes), state, ", ".join(str(c) for c in codes)))
    except Exception as exc:  # a bug here must not turn a finished run into a crashed supervisor
        supervisor.log("notify: not run: %r" % (exc,))


def _failed(record):
    return bool(record.get("lost")) or (record.get("exit_code") != 0 and not record.get("stopped"))


def _describe(record, node):
    """The words `ps` uses for the same end (words.py)."""
    if record.get("lost"):
        how = "lost (%s)" % (record.get("error") or "no exit status")
    else:
        how = how_it_ended(record.get("exit_code"), record.get("signal"), record.get("error") or "")
    return rank_failed(record.get("rank"), node, how)


def verdict(exits, stop_reason, elsewhere, node="", limit=None):
    """(state, reason) of the run as this host knows it at its end: exits by rank (its exit records),
    why its supervisor stopped the ranks (None: they ended on their own), and the first failure the
    other hosts reported (None: none did). The order of outcome.decide: a Ctrl-C, the time limit, a
    failure, then success or a stop."""
    stop_reason = stop_reason or ""
    if stop_reason == "interrupted":
        return "interrupted", INTERRUPTED
    if stop_reason == "time-limit":
        return "timed-out", time_limit_reached(limit)
    failed = sorted((e for e in exits.values() if _failed(e)), key=lambda e: (e.get("ended_at") or 0, e.get("rank")))
    if failed:
        return "failed", _describe(failed[0], node or "this host")
    if elsewhere:
        return "failed", elsewhere
    if stop_reason:
        return _stopped(stop_reason)
    if exits and all(e.get("exit_code") == 0 for e in exits.values()):
        return "succeeded", ""
    return "failed", "a rank ended without an exit status"


def _stopped(stop_reason):
    """Ranks stopped with no failure seen here: by the first-failure teardown of a failure elsewhere (the
    controller's, or a peer's word), or by a stop."""
    if stop_reason.startswith("failed") or stop_reason.startswith("lost contact"):
        return "failed", "a rank on another host failed" if stop_reason == "failed" else stop_reason
    return "stopped", "stopped by clusterrun (%s)" % stop_reason


def environment(spec, conf, state, reason):
    """What a notify command sees: this host's environment, the spec's notify env, the run's secrets
    (taken from the ranks' env in memory: spec.json on disk lost them in the scrub), and the run's end."""
    env = dict(os.environ)
    env.update(conf.get("env") or {})
    names = spec.get("secret_names") or []
    for source in [spec.get("env") or {}] + [r.get("env") or {} for r in spec.get("ranks", [])]:
        env.update({n: source[n] for n in names if isinstance(source.get(n), str) and source[n] != "***"})
    final = state == "succeeded" or not conf.get("restarts_left")
    env.update({"CLUSTERRUN_RUN_ID": str(spec.get("run_id", "")), "CLUSTERRUN_STATE": state,
                "CLUSTERRUN_EXIT_CODE": str(EXIT_CODES[state]), "CLUSTERRUN_REASON": reason,
                "CLUSTERRUN_ATTEMPT": str(conf.get("attempt", 1)), "CLUSTERRUN_FINAL": "1" if final else "0",
                MARKER_ENV: notify_marker(spec)})
    return env


def notify_marker(spec):
    """The marker of the notify commands' processes: not the ranks' (a stop or a clean looking for the
    run's ranks does not count them), found the same way."""
    return process_marker(spec) + "/notify"


def run_all(run_dir, spec, conf, state, reason):
    """Every command, one after another (a failing one does not keep the next from running); their exit
    codes (124: the deadline passed)."""
    env = environment(spec, conf, state, reason)
    masker = Masker(secret_values(spec))
    cwd = job_dir(run_dir) if os.path.isdir(job_dir(run_dir)) else run_dir
    timeout = float(conf.get("timeout") or 60)
    log = open_regular(os.path.join(run_dir, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        return [run_one(command, cwd, env, timeout, log, masker) for command in conf["commands"]]
    finally:
        os.close(log)


def run_one(command, cwd, env, timeout, log, masker):
    """One command, its output into the log (masked), within its deadline; its exit code."""
    t0 = time.time()
    _write(log, masker, ("$ %s\n" % command).encode())
    try:
        proc = subprocess.Popen([login_shell(), "-c", command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)
    except OSError as exc:
        _write(log, masker, ("clusterrun: cannot run it: %s\n" % exc).encode())
        return 127
    try:
        timed_out = _pump(proc, t0 + timeout, log, masker)
    finally:
        proc.stdout.close()
        _kill_group(proc.pid)  # whatever it left running in its group
        _kill_marked(env[MARKER_ENV])  # and whatever left the group
        code = proc.wait()
    if timed_out:
        _write(log, masker, ("clusterrun: killed after %gs (timeouts.notify)\n" % timeout).encode())
        return 124
    _write(log, masker, ("clusterrun: exit %d after %.1fs\n" % (code, time.time() - t0)).encode())
    return code


def _pump(proc, deadline, log, masker):
    """Copy the command's output into the log until it ends; True if the deadline passed first."""
    out = proc.stdout.fileno()
    pending = b""
    exited_at = None
    while True:
        now = time.time()
        if now >= deadline:
            _write(log, masker, pending, final=True)
            return True
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > LINGER:
            break
        ready, _, _ = select.select([out], [], [], min(0.2, deadline - now))
        if not ready:
            continue
        data = os.read(out, 1 << 16)
        if not data:
            break
        pending = _write(log, masker, pending + data)
    _write(log, masker, pending, final=True)
    return False


def _write(log, masker, data, final=False):
    """Write data masked; bytes that may begin a secret wait (returned) unless final."""
    if not data:
        return b""
    data = masker.mask(data)
    hold = 0 if final else masker.holdback(data)
    if len(data) > hold:
        os.write(log, data[:len(data) - hold])
    return data[len(data) - hold:] if hold else b""


def _kill_marked(marker):
    for pid in run_members(marker):  # this user's processes whose environment carries the marker
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
