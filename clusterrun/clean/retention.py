"""Retention after a launch: `clusterrun clean INVENTORY --retention` in a process of its own (its own
session, niced, output to retention.log in the state dir), once per launch, when the ranks run (or the
run was detached). It starts its work once the launching process has ended, or a minute into the run:
a short run never shares its CPU with it, a long one has its hosts cleaned while it trains."""

from __future__ import annotations

import os
import subprocess
import sys

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
        self.inventory = inv.path
        self.due = inv.retention.enabled and not os.environ.get("CLUSTERRUN_NO_RETENTION")

    def on_event(self, ev: object) -> None:
        if isinstance(ev, Phase) and ev.name == "run":  # the ranks run: the hosts' other runs, in the background
            self.start()

    def start(self) -> None:
        """Now (also after a detached launch, whose ranks run without this process)."""
        if self.due:
            self.due = False
            spawn(self.inventory)


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
