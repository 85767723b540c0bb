"""Folding the live view (ui/fold.py) on interleaved streams: every rank the same line, all but one, the
same line at different times, a flood; the prefix notation; the printer in front of it."""

import io
import random

from clusterrun.ui.console import FoldingPrinter, LogPrinter
from clusterrun.ui.fold import FOLD_AT, MAX_HELD, Folder, fold_wanted, group_label, host_ranges

W = 0.15


def src(rank, per_host=4, stream=""):
    return (f"node{rank // per_host}", rank, stream)


def shown(folded, world=None):
    """[(label, line)] one per line shown."""
    return [(group_label(f.sources, world), line) for f in folded for line in f.data.decode().splitlines()]


def by_source(folded):
    """Every source's lines in the order they were shown."""
    seen = {}
    for f in folded:
        for s in f.sources:
            seen.setdefault(s, []).extend(f.data.decode().splitlines())
    return seen


def test_every_rank_the_same_line_is_one_line_naming_every_rank():
    f = Folder(W)
    out = []
    for r in range(32):
        out += f.add(src(r), b"UserWarning: TypedStorage is deprecated\n", r * 0.002)
    assert out == []  # held for its twins
    out += f.due(0.2)
    assert shown(out, 32) == [("node[0-7] r*", "UserWarning: TypedStorage is deprecated")]
    assert f.held == 0


def test_all_but_one_names_the_set_and_the_odd_rank_keeps_its_own_line():
    f = Folder(W)
    out = []
    for r in range(32):
        out += f.add(src(r), b"loading weights\n" if r != 13 else b"rank 13: cache miss, reading from disk\n", 0.01)
    out += f.flush()
    assert shown(out, 32) == [("node[0-7] r0-12,14-31", "loading weights"),
                              ("node3 r13", "rank 13: cache miss, reading from disk")]


def test_a_rank_that_prints_its_own_line_first_still_joins_the_common_one_and_stays_in_order():
    f = Folder(W)
    out = []
    for r in range(8):
        if r == 3:
            out += f.add(src(r), b"only me\n", 0.001)
        out += f.add(src(r), b"epoch 1 done\n", 0.002)
    out += f.flush()
    assert shown(out, 8) == [("node0 r3", "only me"), ("node[0-1] r*", "epoch 1 done")]
    assert by_source(out)[src(3)] == ["only me", "epoch 1 done"]


def test_the_same_line_at_different_times_is_shown_each_time_with_who_printed_it():
    f = Folder(W)
    out = []
    for r in range(16):
        out += f.add(src(r), b"checkpoint saved\n", 0.0 if r < 8 else 1.0)  # half now, half a second later
    out += f.due(2.0)
    assert shown(out, 16) == [("node[0-1] r0-7", "checkpoint saved"), ("node[2-3] r8-15", "checkpoint saved")]


def test_no_line_waits_longer_than_the_window():
    f = Folder(W)
    assert f.add(src(0), b"a\n", 10.0) == []
    assert f.due(10.0 + W - 0.01) == []
    assert shown(f.due(10.0 + W)) == [("node0 r0", "a")]


def test_a_line_printed_twice_by_one_rank_is_shown_twice():
    f = Folder(W)
    out = f.add(src(0), b"tick\ntick\n", 0.0) + f.add(src(1), b"tick\n", 0.0) + f.flush()
    assert shown(out) == [("node0 r0-1", "tick"), ("node0 r0", "tick")]


def test_streams_fold_apart_and_aux_output_names_the_hosts():
    f = Folder(W)
    out = []
    for h in range(4):
        out += f.add((f"node{h}", None, "torchrun"), b"Starting elastic_operator\n", 0.0)
        out += f.add((f"node{h}", h, ""), b"Starting elastic_operator\n", 0.0)
    out += f.flush()
    assert shown(out, 4) == [("node[0-3] torchrun", "Starting elastic_operator"),
                             ("node[0-3] r*", "Starting elastic_operator")]


def test_interleaved_random_streams_lose_nothing_and_keep_each_ranks_order():
    rng = random.Random(7)
    scripts = {r: [f"step {i}" if rng.random() < 0.7 else f"r{r} says {i}" for i in range(200)] for r in range(24)}
    f = Folder(W)
    out, cursor, now = [], dict.fromkeys(scripts, 0), 0.0
    while any(cursor[r] < len(scripts[r]) for r in scripts):
        r = rng.choice([r for r in scripts if cursor[r] < len(scripts[r])])
        n = rng.randint(1, 3)
        lines = scripts[r][cursor[r]:cursor[r] + n]
        cursor[r] += len(lines)
        now += rng.random() * 0.01
        out += f.add(src(r), "".join(x + "\n" for x in lines).encode(), now)
        out += f.due(now)
    out += f.flush()
    assert by_source(out) == {src(r): scripts[r] for r in scripts}
    assert len(out) < 0.6 * sum(map(len, scripts.values()))  # and much was folded (30% are one rank's own)


def test_a_flood_is_held_to_max_held_lines_and_the_others_still_fold():
    f = Folder(W, max_held=1000)
    out, peak = [], 0
    for i in range(20):
        out += f.add(src(0), b"".join(b"batch %d loss 0.1\n" % (i * 500 + j) for j in range(500)), 0.001 * i)
        for r in range(1, 8):
            out += f.add(src(r), b"gloo: connected\n", 0.001 * i) if i == 5 else []
        peak = max(peak, f.held)
    out += f.flush()
    assert peak <= 1000 + 500  # never more than the cap and the batch being placed
    assert by_source(out)[src(0)] == [f"batch {n} loss 0.1" for n in range(10000)]
    assert ("node[0-1] r1-7", "gloo: connected") in shown(out)


def test_a_floods_lines_come_back_as_one_batch_per_run_of_one_rank():
    f = Folder(W)
    f.add(src(0), b"".join(b"%d\n" % i for i in range(1000)), 0.0)
    out = f.due(1.0)
    assert len(out) == 1 and out[0].data.count(b"\n") == 1000


def test_the_default_is_on_from_FOLD_AT_ranks_and_the_flags_win():
    assert not fold_wanted(None, FOLD_AT - 1) and fold_wanted(None, FOLD_AT)
    assert fold_wanted(True, 2) and not fold_wanted(False, 128)
    assert MAX_HELD >= 1000


def test_labels_read_as_node_sets():
    assert group_label([("node1", 3, "")]) == "node1 r3"
    assert group_label([("a", 0, ""), ("b", 1, "")], world=2) == "a,b r*"
    assert group_label([("gpu2", 9, ""), ("gpu1", 4, ""), ("gpu1", 5, "")], world=16) == "gpu[1-2] r4-5,9"
    assert group_label([("n01", 0, ""), ("n02", 1, "")], world=3) == "n01,n02 r0-1"
    assert host_ranges(["node0", "node1", "node2", "gpu1"]) == "node[0-2],gpu1"


def test_the_folding_printer_prints_the_prefix_and_masks_secrets():
    buf = io.BytesIO()
    clock = [0.0]
    p = FoldingPrinter(LogPrinter(out=buf, color=False, secrets=["hunter22"]), world=8, clock=lambda: clock[0])
    for r in range(8):
        p.write(f"node{r // 4}", r, b"token hunter22 loaded\n")
    p.write("node0", -1, b"pip: installed\n", "setup")  # setup: shown as it comes
    assert buf.getvalue() == b"[node0 setup] pip: installed\n"
    clock[0] = 1.0
    p.tick()
    p.write("node1", 5, b"[rank5] odd one\n")
    p.flush()
    assert buf.getvalue().decode().splitlines() == ["[node0 setup] pip: installed", "[node[0-1] r*] token *** loaded",
                                                    "[node1 r5] [rank5] odd one"]


def test_the_run_view_shows_held_lines_on_the_loops_tick_and_at_its_end(capsysbinary):
    import time

    from clusterrun.events import TICK, LogLines, RankEnded
    from clusterrun.ui.run_view import RunView

    view = RunView(quiet=True, fold=True, world=4)
    for r in range(4):
        view.handle(LogLines(f"node{r // 2}", r // 2, r, b"NCCL_ASYNC_ERROR_HANDLING is deprecated\n"))
    view.handle(TICK)
    assert capsysbinary.readouterr().out == b""  # held for its twins
    time.sleep(W + 0.01)
    view.handle(TICK)
    assert capsysbinary.readouterr().out == b"[node[0-1] r*] NCCL_ASYNC_ERROR_HANDLING is deprecated\n"
    view.handle(LogLines("node1", 1, 3, b"rank 3: last words\n"))
    view.handle(RankEnded("node1", 3, "exit code 1", True))  # a rank's last lines come before its end
    assert capsysbinary.readouterr().out == b"[node1 r3] rank 3: last words\n"
    view.handle(LogLines("node0", 0, 0, b"bye\n"))
    view.close()
    assert capsysbinary.readouterr().out == b"[node0 r0] bye\n"


def test_the_closing_summary_folds_to_one_row_per_result():
    """128 rows of `ok` say less than one: ranks and hosts as sets, the durations' range; a rank that ended
    its own way keeps its own row, in the order of each result's lowest rank."""
    from clusterrun.ui.fold import fold_results

    rows = [(r, f"node{r // 2}", "ok", 1.0 + r / 10) for r in range(32) if r != 5]
    rows += [(5, "node2", "exit code 1", 0.4), (40, "gpu1", "ok", None)]
    assert fold_results(rows) == [
        ("0-4,6-31,40 (32)", "node[0-15],gpu1", "ok", "1.0–4.1 s"),
        ("5", "node2", "exit code 1", "0.4 s")]
    assert fold_results([(0, "a", "stopped", None)]) == [("0", "a", "stopped", "-")]


def test_ranks_that_end_well_are_shown_together_and_a_failure_at_once(monkeypatch):
    """Folding (16+ ranks): every rank's `ended: exit code 0` within the window as one line; a failed rank's
    end shows at once, after the ends held so far."""
    import io

    from rich.console import Console

    from clusterrun.events import TICK, RankEnded
    from clusterrun.ui import run_view

    out = io.StringIO()
    monkeypatch.setattr(run_view, "console", lambda stderr=True: Console(file=out, width=200, no_color=True))
    view = run_view.RunView(fold=True, world=16)
    for rank in range(15):
        view.handle(RankEnded(f"node{rank // 8}", rank, "exit code 0", False))
    assert out.getvalue() == ""  # held for the window
    view.handle(RankEnded("node1", 15, "exit code 3", True))
    assert out.getvalue().splitlines() == ["[node[0-1] r0-14] ended: exit code 0", "[node1 r15] ended: exit code 3"]
    view.handle(RankEnded("node0", 3, "exit code 0", False))
    monkeypatch.setattr(run_view.time, "monotonic", lambda: 1e12)  # the window has passed
    view.handle(TICK)
    assert out.getvalue().splitlines()[-1] == "[node0 r3] ended: exit code 0"


def test_a_long_run_of_one_sources_lines_is_released_in_linear_time():
    """A flood is held (up to max_held lines) and a rank's lines come in runs (a chunk of a thousand): a run is
    joined once, not grown a line at a time (bytes + bytes: quadratic; a folded flood of 16 ranks ran at ~40k
    lines/s). 100,000 lines of one source released at once: about a second here; minutes before."""
    import time

    f = Folder(max_held=200000)
    lines = b"".join(b"0 %09d %s\n" % (i, b"x" * 68) for i in range(100000))
    t = time.perf_counter()
    out = f.add(src(0), lines, 0.0) + f.flush()
    assert time.perf_counter() - t < 10.0
    assert len(out) == 1 and out[0].data == lines


def test_a_tick_shows_what_is_due_in_one_write():
    """Lines wait in the folder until the run's loop ticks (every 50 ms): then what is due goes out in one
    write, not a write (and a flush) with every line a rank sent."""
    class Out:
        def __init__(self):
            self.writes = []

        def write(self, data):
            self.writes.append(data)

        def flush(self):
            pass

    out, clock = Out(), [0.0]
    p = FoldingPrinter(LogPrinter(out=out, color=False), world=16, clock=lambda: clock[0])
    for i in range(100):
        for r in range(16):
            p.write(f"node{r // 4}", r, b"%d step %d\n" % (r, i))
    assert out.writes == []  # held for the window
    clock[0] = W
    p.tick()
    assert len(out.writes) == 1 and out.writes[0].count(b"\n") == 1600
