"""Retention after a launch: `clusterrun clean INVENTORY --retention` in a process of its own (its own
session, niced, output to retention.log in the state dir), when the ranks run (or the run was
detached), at most once per `retention.every` (default 1 h) per inventory: a pass connects to every host
and starts a Python there, which back-to-back launches (a sweep, a debugging session) should not pay for
each time. It starts its work once the launching process has ended, or a minute into the run: a short
run never shares its CPU with it, a long one has its hosts cleaned while it trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ..config.inventory import Inventory
from ..events import Phase
from ..registry.store import state_dir

AFTER_PID_WAIT = 60.0
_WAITER = ("import os, sys, time\n"
           "pid, limit, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]\n"
           "end = time.monotonic() + limit\n"
           "while time.monotonic() < end:\n"
           "    try:\n"
           "        os.kill(pid, 0)\n"
           "    except OSError:\n"
           "        break\n"
           "    time.sleep(0.2)\n"
           "os.execv(argv[0], argv)\n")


class AfterLaunch:
    """Watches a launch's events and starts the retention pass once (CLUSTERRUN_NO_RETENTION=1: never)."""

    def __init__(self, inv: Inventory):
        self.inventory = os.path.abspath(inv.path)
        self.every = inv.retention.every_s
        self.due = inv.retention.enabled and not os.environ.get("CLUSTERRUN_NO_RETENTION")

    def on_event(self, ev: object) -> None:
        if isinstance(ev, Phase) and ev.name == "run":  # the ranks run: the hosts' other runs, in the background
            self.start()

    def start(self) -> None:
        """Now (also after a detached launch, whose ranks run without this process), unless a pass for
        this inventory started less than `every` ago."""
        if self.due:
            self.due = False
            if _claim_turn(self.inventory, self.every, time.time()):
                spawn(self.inventory)


STAMPS = "retention-stamps.json"


def _claim_turn(inventory: str, every: float, now: float) -> bool:
    """Whether this inventory's turn has come (and it is taken: the stamp is written now)."""
    path = os.path.join(state_dir(), STAMPS)
    try:
        with open(path) as fh:
            stamps = json.load(fh)
    except (OSError, ValueError):
        stamps = {}
    if not isinstance(stamps, dict):
        stamps = {}
    last = stamps.get(inventory)
    if isinstance(last, (int, float)) and 0 <= now - last < every:
        return False
    stamps[inventory] = now
    os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(stamps, fh)
    os.replace(tmp, path)
    return True


def spawn(inventory: str) -> None:
    folder = state_dir()
    os.makedirs(folder, 0o700, exist_ok=True)
    log = open(os.path.join(folder, "retention.log"), "ab")
    try:
        # a bare interpreter waits (no imports: nothing competes with a short run for the CPU), then
        # becomes `clusterrun clean` (which waits no more: the launch has ended or a minute passed)
        subprocess.Popen([sys.executable, "-S", "-c", _WAITER, str(os.getpid()), str(AFTER_PID_WAIT), sys.executable,
                          "-m", "clusterrun", "clean", os.path.abspath(inventory), "--retention"],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         preexec_fn=lambda: os.nice(10), env={**os.environ, "NO_COLOR": "1"})
    finally:
        log.close()
