"""Line splitting with bounded memory, offset-addressed log copies, and the log printer."""

import io

from clusterrun.hosts.logs import LineSplitter, LogCopy, tail_lines
from clusterrun.ui.console import LogPrinter


def test_splitter_returns_whole_lines_and_keeps_the_rest():
    s = LineSplitter()
    assert s.feed(b"a\nb") == b"a\n"
    assert s.feed(b"c\nd\n") == b"bc\nd\n"
    assert s.feed(b"tail") == b""
    assert s.flush() == b"tail\n"
    assert s.flush() == b""


def test_an_unfinished_lines_wait_starts_when_the_line_does(monkeypatch):
    """The idle flush shows a line that has waited 1 s for its end (a progress bar): the wait is that line's,
    not the stream's. A flood ends nearly every chunk mid-line; under a slow terminal (folding 16 ranks)
    chunks kept coming for over a second with some line always unfinished, and the flush cut one in two."""
    from clusterrun.hosts import logs

    clock = [100.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    s = LineSplitter()
    s.feed(b"0 0000 x")  # a line begins
    for i in range(1, 30):  # a chunk every 0.1 s, each ending mid-line
        clock[0] += 0.1
        assert s.feed(b"x\n%d %04d x" % (i, i)) == b"%d %04d xx\n" % (i - 1, i - 1)
        assert s.partial_since == clock[0]  # the unfinished line is the one begun now
    clock[0] += 0.5
    assert s.feed(b"yyy") == b"" and s.partial_since == clock[0] - 0.5  # the same line goes on: its wait too
    assert s.feed(b"\n") == b"29 0029 xyyy\n" and s.partial_since is None


def test_splitter_memory_is_bounded_by_max_line():
    s = LineSplitter(max_line=8)
    out = s.feed(b"x" * 20)
    assert out == b"x" * 20 + b"\n"  # shown in a piece rather than held
    assert s.feed(b"yy") == b""


def test_splitter_passes_invalid_utf8_and_binary_untouched():
    s = LineSplitter()
    data = b"\xff\xfe\x00bin\x1b[31m\n"
    assert s.feed(data) == data


def test_log_copy_writes_at_offsets_so_replays_do_not_duplicate(tmp_path):
    copy = LogCopy(str(tmp_path / "r.log"))
    copy.write_at(0, b"hello ")
    copy.write_at(6, b"world\n")
    copy.write_at(0, b"hello world\n")  # resent after a reconnect
    assert (tmp_path / "r.log").read_bytes() == b"hello world\n"
    assert copy.size() == 12
    copy.close()


def test_tail_lines(tmp_path):
    p = tmp_path / "x.log"
    p.write_bytes(b"".join(b"line %d\n" % i for i in range(100)) + b"\xff\n")
    assert tail_lines(str(p), 2) == ["line 99", "\ufffd"]
    assert tail_lines(str(tmp_path / "missing"), 3) == []


def test_printer_prefixes_every_line_and_never_interprets_markup():
    out = io.BytesIO()
    p = LogPrinter(out=out, color=False)
    p.write("node1", 3, b"[bold]x[/bold]\n\xffy\n")
    assert out.getvalue() == b"[node1 r3] [bold]x[/bold]\n[node1 r3] \xffy\n"


def test_printer_colours_per_host():
    out = io.BytesIO()
    p = LogPrinter(out=out, color=True)
    p.write("a", 0, b"x\n")
    p.write("b", 1, b"y\n")
    a, b = out.getvalue().split(b"\n")[:2]
    assert a.startswith(b"\x1b[") and b"[a r0]" in a and a.split(b"m", 1)[0] != b.split(b"m", 1)[0]


def test_printer_masks_secret_values_it_is_given():
    out = io.BytesIO()
    p = LogPrinter(out=out, color=False, secrets=["hunter2-long", "x"])  # "x" is too short to mask
    p.write("h", 0, b"token=hunter2-long and x\n")
    assert out.getvalue() == b"[h r0] token=*** and x\n"
