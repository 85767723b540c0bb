"""A run on the terminal: progress on stderr while connecting and pushing (a live view only on a terminal,
and only until the ranks start), logs on stdout, then the root cause and the summary.

One thread renders (the runner's main thread); worker threads only post events.
"""

from __future__ import annotations

import time
from typing import Dict, Iterable

from rich.text import Text

from ..events import HostDone, HostProgress, LogLines, Notice, Phase, RankEnded
from ..outcome import RunOutcome, hint_for
from ..states import RankState, RunState
from .console import LogPrinter, console, mask_text


class RunView:
    """Renders a run's events: progress on stderr, logs on stdout."""

    def __init__(self, *, quiet: bool = False, secrets: Iterable[str] = ()):
        self.err = console(stderr=True)
        self.logs = LogPrinter(secrets=secrets)
        self.quiet = quiet
        self._live = self.err.is_terminal and not quiet
        self._progress = None  # a rich Progress while connecting and pushing on a terminal
        self._tasks: Dict[tuple, int] = {}
        self._phase_started = time.monotonic()
        self._phase = ""
        self._done: Dict[str, int] = {}

    def handle(self, ev: object) -> None:
        if isinstance(ev, LogLines):
            self.logs.write(ev.host, ev.rank, ev.data, ev.stream)
        elif isinstance(ev, Phase):
            self._on_phase(ev)
        elif isinstance(ev, HostProgress):
            self._on_host_progress(ev)
        elif isinstance(ev, HostDone):
            self._on_host_done(ev)
        elif isinstance(ev, RankEnded):
            style = "bold red" if ev.failed else "dim"
            self.err.print(Text(f"[{ev.host} r{ev.rank}] ended: {ev.description}", style=style))
        elif isinstance(ev, Notice):
            style = {"error": "bold red", "warning": "yellow"}.get(ev.level, "")
            self.err.print(Text(ev.text, style=style))

    def _on_host_progress(self, ev: HostProgress) -> None:
        if self._progress is not None:
            key = (ev.phase, ev.host)
            if key not in self._tasks:
                self._tasks[key] = self._progress.add_task(f"{ev.phase} {ev.host}", total=ev.total or None)
            self._progress.update(self._tasks[key], completed=ev.done, total=ev.total or None)

    def _on_host_done(self, ev: HostDone) -> None:
        """A bar fills up; a host without a bar gets a line (without a live view: only pushes do)."""
        self._done[ev.phase] = self._done.get(ev.phase, 0) + 1
        if self._progress is not None:
            key = (ev.phase, ev.host)
            if key in self._tasks:
                self._progress.update(self._tasks[key], completed=self._progress.tasks[self._tasks[key]].total or 1)
            else:
                self._progress.console.print(Text(f"  {ev.host}: {ev.phase} done in {ev.seconds:.2f} s"
                                                  + (f" ({ev.detail})" if ev.detail else ""), style="dim"))
        elif not self.quiet and ev.phase == "push":
            self.err.print(Text(f"  {ev.host}: pushed in {ev.seconds:.2f} s ({ev.detail})", style="dim"))

    def _on_phase(self, ev: Phase) -> None:
        if self._phase and self._phase != "run" and not self.quiet:  # host phases: how many hosts, how long
            took = time.monotonic() - self._phase_started
            count = self._done.get(self._phase, 0)
            self.err.print(Text(f"{self._phase}: {count} host{'s' if count != 1 else ''} in {took:.2f} s",
                                style="dim"))
        self._phase, self._phase_started = ev.name, time.monotonic()
        self._done[ev.name] = 0  # a restart starts its hosts again
        if ev.name == "run":
            self.close()
            if not self.quiet:
                self.err.print(Text(f"running: {ev.detail}", style="bold"))
        elif self._live and self._progress is None:
            # imported here: rich's progress and tables cost ~30 ms at start-up, and a launch needs them
            # only on a terminal (progress) or at its end (tables)
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                      TransferSpeedColumn(), console=self.err, transient=True)
            self._progress.start()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # -------------------------------------------------------------- endings

    def _attempts(self, outcome: RunOutcome) -> None:
        """job.restarts: every attempt and its first failure (the root cause above is the last one's)."""
        from rich.table import Table

        table = Table(title="Attempts (each one's first failure)", title_justify="left")
        for col in ("attempt", "hosts", "world", "result"):
            table.add_column(col)
        for a in outcome.attempts:
            hosts = ", ".join(a.hosts) + (f" ({'; '.join(a.dropped)})" if a.dropped else "")
            result = a.reason or a.state.value if a.state is not RunState.SUCCEEDED else "ok"
            table.add_row(str(a.attempt + 1), hosts, str(a.world_size),
                          mask_text(result, self.logs.secrets))
        self.err.print(table)

    def outcome(self, outcome: RunOutcome) -> None:
        self.close()
        if outcome.state is RunState.RUNNING:
            return
        if outcome.root_cause is not None:
            self._root_cause(outcome)
            self._other_failed_ranks(outcome)
        if outcome.attempts:
            self._attempts(outcome)
        self._summary(outcome)
        self._closing_lines(outcome)

    def _root_cause(self, outcome: RunOutcome) -> None:
        """The first observed failure: its rank, its error, its log's last lines, and a hint."""
        from rich.table import Table

        err = self.err
        rc = outcome.root_cause
        of = f" of attempt {len(outcome.attempts)}" if outcome.attempts else ""
        table = Table(title=f"Root cause{of} (first observed failure)", title_justify="left", show_lines=False)
        for col in ("rank", "host", "result", "time", "log"):
            table.add_column(col)
        when = time.strftime("%H:%M:%S", time.localtime(rc.ended_at)) if rc.ended_at else "-"
        table.add_row(str(rc.rank), rc.host, rc.describe(), when, rc.log_path)
        err.print(table)
        if rc.note and rc.note not in rc.describe():
            err.print(Text(f"error: {mask_text(rc.note, self.logs.secrets)}", style="bold"))
        if rc.tail:
            err.print(Text(f"last lines of rank {rc.rank}:", style="bold"))
            for line in rc.tail:
                err.print(Text("  " + mask_text(line, self.logs.secrets)))
        hint = outcome.hint or hint_for(rc)
        if hint:
            err.print(Text(f"hint: {hint}", style="yellow"))

    def _other_failed_ranks(self, outcome: RunOutcome) -> None:
        rc = outcome.root_cause
        others = [r for r in outcome.ranks if RankState(r.state).failed and r.rank != rc.rank]
        if others:
            self.err.print(Text("other failed ranks: " + ", ".join(f"r{r.rank} on {r.host} ({r.describe()})"
                                                                   for r in others), style="dim"))

    def _summary(self, outcome: RunOutcome) -> None:
        """Every rank's result and duration."""
        from rich.table import Table

        summary = Table(title=f"run {outcome.run_id}: {outcome.state.value}", title_justify="left")
        for col in ("rank", "host", "result", "duration"):
            summary.add_column(col)
        for r in outcome.ranks:
            summary.add_row(str(r.rank), r.host, r.describe() if r.state is not RankState.SUCCEEDED else "ok",
                            f"{r.duration:.1f} s" if r.duration is not None else "-")
        self.err.print(summary)

    def _closing_lines(self, outcome: RunOutcome) -> None:
        """Why the run ended, the hosts it could not be stopped on, the exit code and where the logs are."""
        err = self.err
        if outcome.reason:
            err.print(Text(outcome.reason, style="bold red" if outcome.exit_code else ""))
        if outcome.cleanup_pending:
            err.print(Text(f"not stopped on: {', '.join(outcome.cleanup_pending)} (unreachable); run "
                           f"`clusterrun stop {outcome.run_id}` once they are back", style="bold yellow"))
        err.print(Text(f"exit {outcome.exit_code} after {outcome.seconds:.1f} s; logs: clusterrun logs "
                       f"{outcome.run_id}", style="dim"))
