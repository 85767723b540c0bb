"""What a rank, or another local user, cannot do to the host program or to `stop` (issue 32, findings 4, 5
and 9; docs/security.md): files a rank can write (its stacks file as a FIFO, a symlink, a huge file) never
stall or fool the supervisor nor `clusterrun stacks`; `stop`'s owner is the uid's, not $LOGNAME; a rank
forked as its supervisor dies never runs, and a rank starts with SIGHUP at its default."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from clusterrun.config.inventory import Timeouts
from clusterrun.errors import NotYourRun
from clusterrun.hosts.client import HostClient
from clusterrun.registry.records import RunRecord
from clusterrun.remote.host import files
from clusterrun.remote.host.observe import stacks as H
from clusterrun.remote.host.run import python_launcher as L
from clusterrun.runs.stop import check_owner
from clusterrun.states import RunState
from clusterrun.transport.local import LocalTransport
from hostkit import make_host, project, spec
from support import poll

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -------------------------------------------------------------- finding 4: files a rank can write


def test_a_fifo_symlink_or_huge_file_in_a_ranks_place_is_refused_never_waited_on(tmp_path):
    fifo, link, huge = tmp_path / "fifo", tmp_path / "link", tmp_path / "huge"
    os.mkfifo(fifo)
    link.symlink_to("/etc/passwd")
    with open(huge, "wb") as fh:
        fh.truncate(1 << 32)  # sparse
    t = time.monotonic()
    for path in (fifo, link):
        with pytest.raises(OSError):
            files.read_capped(str(path), 100)
        with pytest.raises(OSError):
            files.open_regular(str(path), os.O_WRONLY | os.O_APPEND)
        assert files.read_json(str(path)) is None and H.read_header(str(path)) is None
        assert H._read_from(str(path), 0) == "" and H._size(str(path)) == 0
    assert len(H._read_from(str(huge), 0)) == H.DUMP_CAP
    assert files.read_json(str(huge)) is None
    H.write_into_log(str(tmp_path), 0, "a note")  # the rank's log: made as a regular file
    os.unlink(tmp_path / "rank-0.log")
    os.mkfifo(tmp_path / "rank-0.log")
    H.write_into_log(str(tmp_path), 0, "a note")  # a FIFO there, nobody reading: refused at once
    assert time.monotonic() - t < 5


def test_a_state_file_written_where_a_rank_planted_a_fifo_is_written_all_the_same(tmp_path):
    target = tmp_path / "hang.json"
    os.mkfifo(f"{target}.tmp-{os.getpid()}")
    files.write_json_atomic(str(target), {"ok": 1})
    assert files.read_json(str(target)) == {"ok": 1}


FIFO_RANK = textwrap.dedent("""\
    import os, sys, time
    path = sys.argv[1]
    while not os.path.exists(path):
        time.sleep(0.01)
    os.unlink(path)
    os.mkfifo(path)            # its stacks file, now a FIFO nobody writes
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # and held open, so a writer's open would not fail either
    print("planted", flush=True)
    time.sleep(60)
    """)


def test_stacks_of_a_rank_that_made_its_stacks_file_a_fifo_answer_at_once(tmp_path):
    """The rank replaced RUN/stacks/rank-0 by a FIFO: `clusterrun stacks` (the host program's `stacks`,
    which the hang watch also runs inside the supervisor) answers, naming what it could not read, instead
    of blocking in the open."""
    c = HostClient(make_host(tmp_path / "w"), LocalTransport("w"), Timeouts(command=10))
    run = "20261201-000000-0401"
    stacks_file = os.path.join(str(tmp_path / "w"), "runs", run, "stacks", "rank-0")
    c.push(run, project(tmp_path, {"job.py": b"x"}), hold=False)
    c.start(run, spec(run, [(0, [sys.executable, "-c", FIFO_RANK, stacks_file])], grace=1.0))
    try:
        log = os.path.join(os.path.dirname(os.path.dirname(stacks_file)), "rank-0.log")
        assert poll(lambda: os.path.exists(log) and "planted" in open(log).read(), timeout=20), "no FIFO planted"
        t = time.monotonic()
        answer = c.stacks(run, via="faulthandler")
        assert time.monotonic() - t < 8
        (entry,) = answer["ranks"]
        assert entry["state"] == "running" and entry["threads"] == [] and "no stacks file" in entry["error"], entry
    finally:
        c.stop(run, 1.0)


# -------------------------------------------------------------- finding 5: stop's owner


def record_of(user):
    return RunRecord(id="20261201-000000-0501", created_at=0.0, inventory="", snapshot={}, plan={},
                     state=RunState.RUNNING, exit_code=None, reason=None, ended_at=None,
                     controller={"user": user, "host": "elsewhere"}, detached=False, phases={}, hosts=(), ranks=())


def test_stop_names_the_user_by_uid_so_logname_passes_for_nobody(monkeypatch):
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    monkeypatch.setenv("LOGNAME", "alice")
    monkeypatch.setenv("USER", "alice")
    with pytest.raises(NotYourRun, match=r"launched by alice .* not by you \(%s\)" % me):
        check_owner(record_of("alice"))
    check_owner(record_of(me))  # one's own run: passes


# -------------------------------------------------------------- finding 9: a rank's fork


ORPHAN = r"""
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from clusterrun.remote.host import procs
from clusterrun.remote.host.run import python_launcher as L
real = procs.die_with_parent
def late(*args):  # the supervisor dies between the fork and the death signal's setup
    time.sleep(0.6)
    return real(*args)
procs.die_with_parent = late
if hasattr(L, "die_with_parent"):
    L.die_with_parent = late
threading.Thread(target=lambda: (time.sleep(0.2), os._exit(0)), daemon=True).start()
out = os.open(os.devnull, os.O_WRONLY)
L.spawn([sys.executable, "-c", "open(%r, 'w').close()" % sys.argv[2]], "/", dict(os.environ), out)
"""


def test_a_rank_forked_as_its_supervisor_dies_never_starts(tmp_path):
    marker = tmp_path / "rank-ran"
    subprocess.run([sys.executable, "-c", ORPHAN, ROOT, str(marker)], timeout=30)
    time.sleep(1.5)  # the child's late setup, then what its exec would have done
    assert not marker.exists(), "the rank started with no supervisor to stop it"


def test_a_rank_starts_with_sighup_at_its_default_though_the_supervisor_ignores_it(tmp_path):
    out_path = tmp_path / "out"
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT, 0o600)
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as the supervisor has it (run/supervisor.py)
    try:
        pid = L.spawn([sys.executable, "-c", "print(open('/proc/self/status').read())"], "/", dict(os.environ), fd)
    finally:
        signal.signal(signal.SIGHUP, old)
        os.close(fd)
    os.waitpid(pid, 0)
    ignored = next(int(line.split()[1], 16) for line in out_path.read_text().splitlines() if line.startswith("SigIgn:"))
    assert not ignored & 1 << (signal.SIGHUP - 1), hex(ignored)


# -------------------------------------------------------------- finding 8: notify past its deadline


def test_a_notify_command_that_left_its_process_group_dies_at_its_deadline(tmp_path):
    """`setsid sleep` escapes the command's group (the group kill misses it) and holds its output open:
    the deadline's kill finds it by the process marker in its environment."""
    from clusterrun.remote.host.procs import exists
    from clusterrun.remote.host.run import notify

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = {"run_id": "20261201-000000-0801", "node": "n0"}
    conf = {"commands": ["setsid sleep 300 & echo escapee $!"], "timeout": 1}
    t = time.monotonic()
    assert notify.run_all(str(run_dir), spec, conf, "succeeded", "") == [124]
    assert time.monotonic() - t < 10
    text = (run_dir / notify.LOG).read_text()
    pid = int(re.search(r"^escapee (\d+)$", text, re.M).group(1))
    assert poll(lambda: exists(pid, None) is False, timeout=5), f"pid {pid} outlived notify's deadline"
