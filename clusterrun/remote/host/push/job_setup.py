"""job.setup on this host: the inventory author's shell commands, run in the pushed job folder before any
rank starts, once per content (a marker per key in WORKDIR/setup/).

Protocol (framed JSON on the push's held channel, after the push's answer; see held.py):
  controller → {"setup": {"commands": [...], "key": hex, "timeout": seconds, "env": {...}}}
  host       → {"out": text}*           what the commands print, as it comes (also kept in RUN_DIR/setup.log)
               {"beat": now}*           every 2 s while they run, so a lost host shows
  host       → {"setup": {"exit": code, "command": index, "skipped": bool, "seconds": s, "ran_at": t}}
Commands run one after another with the user's login shell (`SHELL -c COMMAND`, as ssh runs a command);
the first that fails ends the setup. The whole setup has a deadline (exit 124 when it passes). If the
controller goes away meanwhile (end of input), the commands' process group is killed.
"""

import os
import select
import subprocess
import time

from ..files import read_json, write_json_atomic
from ..procs import kill_group
from ..secrets import Masker
from ..shell import login_shell
from ..wire import send_msg

BEAT_EVERY = 2.0
EXIT_TIMEOUT = 124


def run_setup(workdir, run_dir, request, stdin):
    """Run (or skip) the setup; answer as the protocol says; return True when it succeeded."""
    marker_dir = os.path.join(workdir, "setup")
    marker = os.path.join(marker_dir, "%s.json" % request["key"])
    done = read_json(marker)
    if done is not None:
        send_msg({"setup": {"exit": 0, "skipped": True, "command": None, "seconds": 0.0,
                            "ran_at": done.get("ran_at"), "run_id": done.get("run_id")}})
        return True
    t0 = time.time()
    env = dict(os.environ)
    env.update(request.get("env") or {})
    masker = Masker(sorted((env[n].encode() for n in request.get("secret_names", []) if len(env.get(n, "")) >= 4),
                           key=len, reverse=True))
    deadline = t0 + float(request.get("timeout", 600))
    log = os.open(os.path.join(run_dir, "setup.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for index, command in enumerate(request["commands"]):
            code = _run_one(command, os.path.join(run_dir, "job"), env, deadline, log, stdin, masker)
            if code != 0:
                send_msg({"setup": {"exit": code, "skipped": False, "command": index, "seconds": time.time() - t0}})
                return False
    finally:
        os.close(log)
    os.makedirs(marker_dir, 0o700, exist_ok=True)
    write_json_atomic(marker, {"ran_at": time.time(), "seconds": time.time() - t0,
                               "run_id": os.path.basename(run_dir), "commands": request["commands"]})
    send_msg({"setup": {"exit": 0, "skipped": False, "command": None, "seconds": time.time() - t0}})
    return True


def _run_one(command, cwd, env, deadline, log, stdin, masker):
    os.write(log, ("$ %s\n" % command).encode())
    send_msg({"out": masker.mask_text("$ %s\n" % command)})
    proc = subprocess.Popen([login_shell(), "-c", command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    out = proc.stdout.fileno()
    watch = [out, stdin.fileno()]
    last_beat = time.time()
    pending = b""
    try:
        while True:
            now = time.time()
            if now >= deadline:
                kill_group(proc)
                message = "clusterrun: setup timed out (timeouts.setup); its commands were killed\n"
                os.write(log, message.encode())
                send_msg({"out": message})
                return EXIT_TIMEOUT
            ready, _, _ = select.select(watch, [], [], min(BEAT_EVERY, deadline - now))
            if stdin.fileno() in ready and not os.read(stdin.fileno(), 1):
                kill_group(proc)  # the controller went away: nobody will start this run
                raise EOFError("the controller went away during the setup")
            if out in ready:
                data = os.read(out, 1 << 16)
                if not data:
                    if pending:
                        send_msg({"out": masker.mask(pending).decode("utf-8", "replace")})
                    return proc.wait()
                os.write(log, data)
                pending = masker.mask(pending + data)
                hold = masker.holdback(pending)  # the start of a secret may be in the next read
                ready_part, pending = pending[:len(pending) - hold], pending[len(pending) - hold:]
                if ready_part:
                    send_msg({"out": ready_part.decode("utf-8", "replace")})
            if time.time() - last_beat >= BEAT_EVERY:
                send_msg({"beat": time.time()})
                last_beat = time.time()
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            kill_group(proc)



