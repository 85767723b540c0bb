"""What the terminal shows: the launch's phases (one line each, on a terminal as in a pipe, however many
hosts) and `ps` at 80 columns (the run id and state whole, notes wrapped at words)."""

import io
import time

from rich.console import Console

from clusterrun.events import HostDone, HostProgress, Phase
from clusterrun.outcome import RankResult
from clusterrun.registry.records import HostRecord, RunRecord
from clusterrun.states import HostState, RankState, RunState
from clusterrun.ui.run_view import RunView
from clusterrun.ui.tables import one_line, show_runs

HOSTS = [f"node{i}" for i in range(16)]


def launch_phases(view):
    for phase in ("connect", "push", "start"):
        view.handle(Phase(phase))
        for i, host in enumerate(HOSTS):
            if phase == "push":
                view.handle(HostProgress("push", host, 500, 1000))
                view.handle(HostDone("push", host, 0.1 + i / 100, sent=1000 if i else 0, total=1000, files=3))
            else:
                view.handle(HostDone(phase, host, 0.05 + i / 100))
    view.handle(Phase("run", "32 ranks on 16 hosts"))


def test_the_launch_says_one_line_per_phase_on_a_terminal_and_in_a_pipe():
    for terminal in (True, False):
        view = RunView(hosts=len(HOSTS))
        view.err = Console(file=io.StringIO(), force_terminal=terminal, width=100, color_system=None)
        view._live = terminal  # a live widget only on a terminal (it redraws one line; what stays is printed)
        printed: list = []
        view.err.print = lambda *things, out=printed, **kw: out.extend(str(t) for t in things)
        launch_phases(view)
        view.close()
        lines = [line for text in printed for line in text.splitlines() if line.strip()]
        assert [line.split(":")[0] for line in lines] == ["connect", "push", "start", "running"], lines
        assert not any("done in" in line or line.startswith("  node") for line in lines)  # no line per host
        assert "push: 16 hosts in" in lines[1] and "15.0 KB sent (3 files, 1.0 KB per host)" in lines[1]
        assert "slowest node15 0.20 s" in lines[0]


def record(run_id, state, reason=""):
    now = time.time()
    return RunRecord(id=run_id, created_at=now - 60, inventory="inv.yaml", snapshot={}, plan={"nodes": [{}] * 4},
                     state=state, exit_code=0 if state is RunState.SUCCEEDED else 1, reason=reason, ended_at=now,
                     controller=None, detached=False, phases={},
                     hosts=tuple(HostRecord(i, f"node{i}", HostState.DONE, None, None, None, None, None)
                                 for i in range(4)),
                     ranks=tuple(RankResult(r, r, f"node{r}", RankState.SUCCEEDED) for r in range(4)))


def test_ps_at_80_columns_keeps_the_run_id_and_state_whole_and_wraps_notes_at_words():
    note = ("preflight failed on 1 host; nothing was started:\n  node0: preflight failed: master port 29500 is in "
            "use on node0 by clusterrun run 20261201-201111-247b (rank 0; pid 1234 python train.py, user cr)\n"
            "      hint: `clusterrun stop 20261201-201111-247b` if that run should end")
    out = Console(record=True, width=80, color_system=None)
    show_runs([(record("20261201-201123-b695", RunState.FAILED, note), {}),
               (record("20261201-201018-3062", RunState.SUCCEEDED), {})], out)
    text = out.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "20261201-201123-b695" in text and "20261201-201018-3062" in text and "succeeded" in text
    assert "…" not in text.split("note")[1].split("preflight")[0]  # the id and state cells are not cut
    words = text.split()
    for word in one_line(note, 200).split():  # every word of the note whole, in order (wrapped, not cut)
        assert word in words, word


def test_notes_are_cut_at_a_word():
    assert one_line("a b\n  c", 10) == "a b c"
    assert one_line("alpha beta gamma delta", 14) == "alpha beta…"


def summary_lines(events, hosts=4):
    """What a view prints for these events (each a phase's one line), in a pipe."""
    view = RunView(hosts=hosts)
    view.err = Console(file=io.StringIO(), force_terminal=False, width=200, color_system=None)
    view._live = False
    printed: list = []
    view.err.print = lambda *things, out=printed, **kw: out.extend(str(t) for t in things)
    for ev in events:
        view.handle(ev)
    view.close()
    return [line for text in printed for line in text.splitlines() if line.strip()]


def test_each_summary_line_counts_the_work_done():
    """Counts that contradicted themselves (issue 36): one check per summary line against what was done."""
    from clusterrun.events import counted

    # a pull fetches each host's own files: 2 + 2 is 4, not the most any host got
    pulled = summary_lines([Phase("pull"), HostDone("pull", "a", 0.1, sent=2000, files=2),
                            HostDone("pull", "b", 0.1, sent=2000, files=2)], hosts=2)
    assert pulled == [pulled[0]] and pulled[0].startswith("pull: 2 hosts in ") and "(4 files new or changed)" in pulled[0]
    one = summary_lines([Phase("pull"), HostDone("pull", "a", 0.1, sent=1000, files=1)], hosts=1)
    assert one[0].startswith("pull: 1 host in ") and "(1 file new or changed)" in one[0], one
    # a push that no host finished (the launch found the hosts busy) says nothing, not "push: 0 hosts"
    assert summary_lines([Phase("connect"), *(HostDone("connect", h, 0.1) for h in "abcd"), Phase("push")]) == \
        [summary_lines([Phase("connect"), *(HostDone("connect", h, 0.1) for h in "abcd")])[0]]
    # launch --wait: hosts that pushed before the wait count in the push's line after it (4, not 3)
    waited = summary_lines([Phase("push"), HostDone("push", "a", 0.1, total=10, files=1), Phase("wait"),
                            Phase("push", "after waiting 2 s"),
                            *(HostDone("push", h, 0.1, total=10, files=1) for h in "bcd"), Phase("start")])
    assert [line.split(":")[0] for line in waited] == ["waited 0 s for its turn", "push"], waited
    assert waited[1].startswith("push: 4 hosts in "), waited
    # --detach --wait hands the run to the hosts' waiters: a queue phase, not "waited 0 s for its turn"
    queued = summary_lines([Phase("queue"), *(HostDone("queue", h, 0.1) for h in "abcd")])
    assert queued[0].startswith("queue: 4 hosts in ") and not any("for its turn" in line for line in queued), queued
    assert (counted(1, "host"), counted(2, "rank"), counted(1, "file"), counted(3, "output")) == \
        ("1 host", "2 ranks", "1 file", "3 outputs")
