"""job.setup on one host, on the channel that pushed the job: its output streamed as `[host setup]` and
kept in the run's local `HOST-setup.log`; skipped when the host ran the same commands on the same files."""

from __future__ import annotations

import time
from typing import Callable

from ..config.inventory import Timeouts
from ..events import HostDone, LogLines, Notice
from ..hosts.push import HeldPush


def run_setup(held: HeldPush, request: dict, host: str, node_rank: int, *, copy: str, timeouts: Timeouts,
              lines: Callable[[object], None], post: Callable[[object], None]) -> None:
    def output(text: str) -> None:
        data = text.encode()
        with open(copy, "ab") as fh:
            fh.write(data)
        lines(LogLines(host, node_rank, -1, data, stream="setup"))

    done = held.setup(request, output, silence_s=max(timeouts.host_lost, timeouts.command))
    if done.skipped:
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(done.ran_at)) if done.ran_at else "before"
        post(Notice(f"{host}: setup unchanged since {when} (run {done.run_id}): skipped"))
    else:
        post(HostDone("setup", host, done.seconds))
