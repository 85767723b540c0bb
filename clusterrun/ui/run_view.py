"""A run on the terminal: progress on stderr while connecting and pushing (a live view only on a terminal,
and only until the ranks start), logs on stdout, then the root cause and the summary.

One thread renders (the runner's main thread); worker threads only post events.
"""

from __future__ import annotations

import time
from typing import Dict, Iterable, Optional

from rich.text import Text

from ..events import (Forwarded, HostDone, HostProgress, LogLines, Notice, Phase, RankEnded, Starting, Tick,
                      Waiting)
from ..outcome import RunOutcome, hint_for
from ..states import RankState, RunState
from ..config.sizes import size_text
from .console import console, log_printer, mask_text


class _PhaseTally:
    """What the hosts of one phase reported: how many are done, the slowest, what a push sent."""

    def __init__(self, name: str):
        self.name = name
        self.started = time.monotonic()
        self.done = 0
        self.slowest: tuple = ("", 0.0)
        self.sent = self.total = self.relayed = self.files = 0
        self.progress: Dict[str, tuple] = {}  # host -> (sent so far, its total): a push under way
        self.before = 0.0  # seconds it ran before a pause (launch --wait: the push resumes after the wait)

    def host_done(self, ev: HostDone) -> None:
        # a host's push begins as soon as it is connected, before the phase (every host connected) does
        self.started = min(self.started, time.monotonic() - ev.seconds)
        self.done += 1
        if ev.seconds >= self.slowest[1]:
            self.slowest = (ev.host, ev.seconds)
        self.sent, self.total, self.relayed = self.sent + ev.sent, self.total + ev.total, self.relayed + ev.relayed
        # a push sends the same files to every host (the most any host got); a pull fetches each host's own
        self.files = self.files + ev.files if self.name == "pull" else max(self.files, ev.files)
        self.progress.pop(ev.host, None)

    def line(self) -> str:
        """`push: 4 hosts in 0.21 s, 230.1 KB sent (7 files, 57.5 KB per host); slowest node1 0.21 s`."""
        took = self.before + time.monotonic() - self.started
        text = f"{self.name}: {self.done} host{'s' if self.done != 1 else ''} in {took:.2f} s"
        if self.name == "push" and self.done:
            each = f"{self.files} file{'s' if self.files != 1 else ''}, {size_text(self.total / self.done)} per host"
            text += (f", {size_text(self.sent)} sent ({each})" if self.sent else
                     f", nothing to send (the hosts had all {each})") + \
                (f", {size_text(self.relayed)} passed on between hosts" if self.relayed else "")
        if self.name == "pull" and self.done:
            text += f", {size_text(self.sent)} received ({self.files} file{'s' if self.files != 1 else ''} new or changed)"
        if self.done > 1:
            text += f"; slowest {self.slowest[0]} {self.slowest[1]:.2f} s"
        return text

    def live_info(self, hosts: int) -> str:
        """The live widget's text: hosts done, and bytes for a push under way."""
        text = f"{self.done}/{hosts} hosts"
        if self.progress:
            sent = sum(p[0] for p in self.progress.values())
            text += f", {size_text(sent)} of {size_text(sum(p[1] for p in self.progress.values()))}"
        return text


class RunView:
    """Renders a run's events: progress on stderr, logs on stdout."""

    def __init__(self, *, quiet: bool = False, secrets: Iterable[str] = (), inventory: str = "INVENTORY",
                 hosts: int = 0, fold: bool = False, world: Optional[int] = None):
        """fold: the same line from many ranks shown once with their set (ui.fold); world: the run's ranks."""
        self.err = console(stderr=True)
        self.inventory = inventory  # named in hints
        self.logs = log_printer(secrets, fold, world)
        self.fold, self.world = fold, world
        self._ends: list = []  # folding: ranks that ended well, shown together (_show_ends) within the window
        self._ends_since = 0.0
        self.quiet = quiet
        self.hosts = hosts  # how many the launch has (the live widget's "3/16 hosts")
        self._live = self.err.is_terminal and not quiet
        self._progress = None  # a rich Progress (one line: the phase under way) while connecting and pushing
        self._task = None
        self._phase: Optional[_PhaseTally] = None
        self._paused: Optional[_PhaseTally] = None  # the push, while launch --wait waits for its turn

    def handle(self, ev: object) -> None:
        if isinstance(ev, LogLines):
            self.logs.write(ev.host, ev.rank, ev.data, ev.stream)
        elif isinstance(ev, Tick):
            self.logs.tick()
            if self._ends and time.monotonic() - self._ends_since >= self._window():
                self._show_ends()
        elif isinstance(ev, Phase):
            self._on_phase(ev)
        elif isinstance(ev, (HostProgress, HostDone)):
            self._on_host(ev)
        elif isinstance(ev, RankEnded):
            self._on_rank_ended(ev)
        elif isinstance(ev, Notice):
            self.logs.flush()
            self._show_ends()
            style = {"error": "bold red", "warning": "yellow"}.get(ev.level, "")
            self.err.print(Text(ev.text, style=style))
        elif isinstance(ev, Waiting):
            self._on_waiting(ev)
        elif isinstance(ev, Starting):  # job.start order rank: which host starts now
            self._on_starting(ev)
        elif isinstance(ev, Forwarded):
            from .ports import banner

            self.err.print(Text(banner(ev.remote, ev.local, ev.host)))

    def _on_rank_ended(self, ev: RankEnded) -> None:
        self.logs.flush()  # a rank's last lines before its end
        if self.fold and not ev.failed:  # every rank's "ended: exit code 0" as one line (_show_ends)
            self._ends_since = self._ends_since if self._ends else time.monotonic()
            self._ends.append(ev)
            return
        self._show_ends()
        style = "bold red" if ev.failed else "dim"
        self.err.print(Text(f"[{ev.host} r{ev.rank}] ended: {ev.description}", style=style))

    @staticmethod
    def _window() -> float:
        from .fold import WINDOW_S

        return WINDOW_S

    def _show_ends(self) -> None:
        """The ranks that ended well since the last time, one line per way they ended (`[node[0-31] r*]
        ended: exit code 0`), in the order each way first came."""
        if not self._ends:
            return
        from .fold import group_label

        ways: Dict[str, list] = {}
        for ev in self._ends:
            ways.setdefault(ev.description, []).append((ev.host, ev.rank, ""))
        self._ends = []
        for description, sources in ways.items():
            self.err.print(Text(f"[{group_label(sources, self.world)}] ended: {description}", style="dim"))

    def _on_host(self, ev: object) -> None:
        """A host's progress in the phase under way, or its part of it done."""
        if self._phase is None:
            return
        if isinstance(ev, HostDone):
            self._phase.host_done(ev)
        else:
            self._phase.progress[ev.host] = (ev.done, ev.total)
        self._refresh()

    def _on_starting(self, ev: Starting) -> None:
        target = self._progress.console if self._progress is not None else self.err
        if not self.quiet:
            target.print(Text(ev.describe(), style="dim"))

    def _on_waiting(self, ev: Waiting) -> None:
        """launch --wait: a line each time its place in line changes (what it waits for, on which host)."""
        from .claims import wait_line

        line = wait_line(ev.status)
        target = self._progress.console if self._progress is not None else self.err
        target.print(Text(line, style="yellow"))

    def busy(self, exc) -> None:
        """Exit 5: who holds what on each busy host."""
        from .claims import show_busy

        show_busy(exc, self.err)

    def _refresh(self) -> None:
        if self._progress is not None and self._task is not None and self._phase is not None:
            self._progress.update(self._task, description=self._phase.name, completed=self._phase.done,
                                  total=max(self.hosts, self._phase.done) or None,
                                  info=self._phase.live_info(max(self.hosts, self._phase.done)))

    def _end_phase(self) -> None:
        """One line for the phase that ended (the same on a terminal and in a pipe)."""
        if self._phase is not None and self._phase.name == "wait" and not self.quiet:  # launch --wait: in line
            self.err.print(Text(f"waited {time.monotonic() - self._phase.started:.0f} s for its turn", style="dim"))
        elif self._phase is not None and self._phase.name != "run" and self._phase.done and not self.quiet:
            self.err.print(Text(self._phase.line(), style="dim"))  # (a phase no host finished says nothing)
        self._phase = None

    def _on_phase(self, ev: Phase) -> None:
        self.logs.flush()
        self._show_ends()
        if ev.name == "wait" and self._phase is not None and self._phase.name == "push":
            # the push's line comes after the wait, counting the hosts that pushed before it too
            self._phase.before += time.monotonic() - self._phase.started
            self._paused, self._phase = self._phase, None
        self._end_phase()
        if ev.name == "push" and self._paused is not None:
            self._phase, self._paused = self._paused, None
            self._phase.started = time.monotonic()
        else:
            self._phase = _PhaseTally(ev.name)
        if ev.name == "run":
            self.close()
            if not self.quiet:
                self.err.print(Text(f"running: {ev.detail}", style="bold"))
            return
        if self._live and self._progress is None:
            # imported here: rich's progress and tables cost ~30 ms at start-up, and a launch needs them
            # only on a terminal (progress) or at its end (tables)
            from rich.progress import BarColumn, Progress, TextColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                      console=self.err, transient=True)
            self._progress.start()
            self._task = self._progress.add_task(ev.name, total=self.hosts or None, info="")
        self._refresh()

    def close(self) -> None:
        self.logs.flush()
        self._show_ends()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None
        self._end_phase()

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
        if outcome.state in (RunState.RUNNING, RunState.WAITING):
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
        hint = (outcome.hint or hint_for(rc)).replace("INVENTORY", self.inventory)
        if hint:
            err.print(Text(f"hint: {hint}", style="yellow"))

    def _other_failed_ranks(self, outcome: RunOutcome) -> None:
        rc = outcome.root_cause
        others = [r for r in outcome.ranks if RankState(r.state).failed and r.rank != rc.rank]
        if others:
            self.err.print(Text("other failed ranks: " + ", ".join(f"r{r.rank} on {r.host} ({r.describe(rc)})"
                                                                   for r in others), style="dim"))

    def _summary(self, outcome: RunOutcome) -> None:
        """Every rank's result and duration; folding, one row per result (ranks `0-30 (31)`, hosts
        `node[0-30]`, durations `1.0–9.9 s`): 128 rows of `ok` say less than one."""
        from rich.table import Table

        summary = Table(title=f"run {outcome.run_id}: {outcome.state.value}", title_justify="left")
        rows = [(r.rank, r.host, r.describe(outcome.root_cause) if r.state is not RankState.SUCCEEDED else "ok",
                 r.duration) for r in outcome.ranks]
        if self.fold:
            from .fold import fold_results

            for col in ("ranks", "hosts", "result", "duration"):
                summary.add_column(col)
            for row in fold_results(rows):
                summary.add_row(*row)
        else:
            for col in ("rank", "host", "result", "duration"):
                summary.add_column(col)
            for rank, host, result, seconds in rows:
                summary.add_row(str(rank), host, result, f"{seconds:.1f} s" if seconds is not None else "-")
        self.err.print(summary)

    def _closing_lines(self, outcome: RunOutcome) -> None:
        """Why the run ended, the hosts it could not be stopped on, the exit code and where the logs are."""
        err = self.err
        if outcome.reason:
            err.print(Text(outcome.reason, style="bold red" if outcome.exit_code else ""))
        if outcome.cleanup_pending:
            lost = {r.host for r in outcome.ranks if r.state is RankState.LOST}
            gone = [h for h in outcome.cleanup_pending if h in lost]
            other = [h for h in outcome.cleanup_pending if h not in lost]
            parts = ([f"{', '.join(gone)} (lost: not reached to stop what may run there)"] if gone else []) + \
                ([f"{', '.join(other)} (unreachable)"] if other else [])
            err.print(Text(f"not stopped on: {'; '.join(parts)}; `clusterrun stop {outcome.run_id}` once "
                           f"{'it is' if len(outcome.cleanup_pending) == 1 else 'they are'} back", style="bold yellow"))
        err.print(Text(f"exit {outcome.exit_code} after {outcome.seconds:.1f} s; logs: clusterrun logs "
                       f"{outcome.run_id}", style="dim"))
