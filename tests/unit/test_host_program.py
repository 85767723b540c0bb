"""The host program (remote/host/) driven through the local transport: push by content hash,
detached start, following by offset, stop by recorded process group. Real processes, no network."""

import json
import os
import signal
import stat
import sys
import time
from functools import partial

import pytest

from clusterrun.errors import PushError, RemoteCommandError
from clusterrun.hosts.client import HostClient
from clusterrun.config.inventory import Timeouts
from clusterrun.transport.local import LocalTransport
from hostkit import make_host, project, spec
from support import alive, poll, wait_for


def test_push_is_incremental_by_content_and_private(host_client, tmp_path):
    m = project(tmp_path, {"job.py": b"print(1)\n", "data/a.bin": b"A" * 5000, "data/b.bin": b"A" * 5000})
    first = host_client.push("20261130-000000-0001", m, hold=False).result
    assert (first.objects, first.sent_bytes, first.files) == (2, 5009, 3)
    job = tmp_path / "work" / "runs" / "20261130-000000-0001" / "job"
    assert (job / "data" / "b.bin").read_bytes() == b"A" * 5000
    assert stat.S_IMODE(os.stat(tmp_path / "work" / "runs" / "20261130-000000-0001").st_mode) == 0o700
    again = host_client.push("20261130-000000-0002", m, hold=False).result
    assert (again.objects, again.sent_bytes) == (0, 0)  # unchanged re-launch sends nothing
    assert os.stat(job / "data" / "a.bin").st_ino == os.stat(
        tmp_path / "work" / "runs" / "20261130-000000-0002" / "job" / "data" / "a.bin").st_ino


def test_push_refuses_an_existing_run_folder(host_client, tmp_path):
    m = project(tmp_path, {"job.py": b"x"})
    host_client.push("20261130-000000-0003", m, hold=False)
    with pytest.raises(PushError, match="already exists"):
        host_client.push("20261130-000000-0003", m, hold=False)


def test_corrupt_content_is_rejected_and_nothing_is_left(host_client, tmp_path):
    m = project(tmp_path, {"job.py": b"original\n"})
    (tmp_path / "proj" / "job.py").write_bytes(b"tampered\n")  # changes after hashing: sent bytes differ
    with pytest.raises(PushError, match="corrupted"):
        host_client.push("20261130-000000-0004", m, hold=False)
    assert not (tmp_path / "work" / "runs" / "20261130-000000-0004").exists()


def test_a_manifest_path_escaping_the_run_is_refused(host_client, tmp_path):
    from clusterrun.hosts.manifest import FileEntry, Manifest

    evil = FileEntry(rel="../../escape.txt", sha="0" * 64, size=0, executable=False, source="/dev/null")
    with pytest.raises(PushError, match="unsafe path"):
        host_client.push("20261130-000000-0005", Manifest(files=(evil,), dirs=(), symlinks=()), hold=False)
    assert not (tmp_path / "escape.txt").exists()


def start_sleepers(host_client, tmp_path, run_id, code="import time; time.sleep(60)", n=2, **extra):
    host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
    ranks = [(r, [sys.executable, "-c", code]) for r in range(n)]
    return host_client.start(run_id, spec(run_id, ranks, **extra))


def test_start_detaches_and_stop_ends_every_rank_by_process_group(host_client, tmp_path):
    run_id = "20261130-000000-0010"
    state = start_sleepers(host_client, tmp_path, run_id, grace=1.0)
    pids = [state["ranks"][str(r)]["pid"] for r in range(2)]
    assert all(alive(p) for p in pids)
    assert all(os.getpgid(p) == p for p in pids)  # each rank leads its own process group
    assert os.getsid(state["supervisor"]["pid"]) == state["supervisor"]["pid"]  # detached session
    t = time.monotonic()
    answer = host_client.stop(run_id, 1.0)
    assert time.monotonic() - t < 3
    assert not any(alive(p) for p in pids)
    assert {r: (e["signal"], e["stopped"]) for r, e in answer["exits"].items()} == {
        "0": (signal.SIGTERM, True), "1": (signal.SIGTERM, True)}
    assert stat.S_IMODE(os.stat(tmp_path / "work" / "runs" / run_id / "spec.json").st_mode) == 0o600
    assert host_client.stop(run_id, 1.0)["left"] == []  # idempotent


def test_a_rank_ignoring_term_is_killed_after_the_grace(host_client, tmp_path):
    run_id = "20261130-000000-0011"
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    state = start_sleepers(host_client, tmp_path, run_id, code=code, n=1, grace=0.5)
    time.sleep(0.3)
    answer = host_client.stop(run_id, 0.5)
    assert answer["exits"]["0"]["signal"] == signal.SIGKILL
    assert not alive(state["ranks"]["0"]["pid"])


wait_until = partial(wait_for, timeout=5.0, every=0.05)  # this module's pace: local processes


def test_a_supervisor_that_dies_takes_its_ranks_and_the_next_call_finishes_its_work(host_client, tmp_path):
    """Issue 21: a killed supervisor leaves its ranks stopped, not orphaned (PR_SET_PDEATHSIG), and the next
    host-program call for the run records them lost, kills what they left (a process in a session of its
    own, found by its marker) and scrubs the secret from every file."""
    run_id = "20261130-000000-0012"
    escapee = tmp_path / "escapee.pid"
    code = ("import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)'], start_new_session=True); open({str(escapee)!r}, 'w').write(str(p.pid)); "
            "print('token', os.environ['TOKEN'], flush=True); time.sleep(60)")
    host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
    s = spec(run_id, [(r, [sys.executable, "-c", code]) for r in range(2)], grace=1.0, secret_names=["TOKEN"])
    for r in s["ranks"]:
        r["env"]["TOKEN"] = "s3cr3t-value"
    state = host_client.start(run_id, s)
    run = tmp_path / "work" / "runs" / run_id
    assert wait_until(lambda: escapee.exists() and b"s3cr3t-value" in (run / "rank-0.log").read_bytes())
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    pids = [state["ranks"][str(r)]["pid"] for r in range(2)]
    assert wait_until(lambda: not any(alive(p) for p in pids))  # the ranks died with their supervisor
    stray = int(escapee.read_text())
    assert alive(stray)  # not a child of the supervisor: only the next call can end it
    status = host_client.status(run_id)
    assert status["done"] and {r["exit"]["lost"] for r in status["ranks"].values()} == {True}
    assert wait_until(lambda: not alive(stray))
    assert json.loads((run / "done.json").read_text())["orphaned"] is True
    for path in run.rglob("*"):
        if path.is_file() and "job" not in path.relative_to(run).parts:
            assert b"s3cr3t-value" not in path.read_bytes(), path
    assert host_client.stop(run_id, 1.0)["left"] == []  # and stop still works


def test_stop_also_ends_processes_that_left_the_group(host_client, tmp_path):
    run_id = "20261130-000000-0013"
    escapee = tmp_path / "escapee.pid"
    code = ("import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)'], start_new_session=True); open({str(escapee)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    start_sleepers(host_client, tmp_path, run_id, code=code, n=1, grace=0.5)
    for _ in range(100):
        if escapee.exists() and escapee.read_text():
            break
        time.sleep(0.05)
    pid = int(escapee.read_text())
    assert alive(pid)
    host_client.stop(run_id, 0.5)
    time.sleep(0.2)
    assert not alive(pid)


def test_follow_streams_logs_by_offset_then_exits(host_client, tmp_path):
    run_id = "20261130-000000-0020"
    code = "import sys; [print('line', i) for i in range(1000)]; sys.stdout.buffer.write(b'\\xff raw'); sys.exit(3)"
    start_sleepers(host_client, tmp_path, run_id, code=code, n=1)
    stream = host_client.follow(run_id, {0: 0})
    data, exit_rec = b"", None
    while True:
        frame = stream.next(10)
        if frame.kind == "L":
            assert frame.offset == len(data)
            data += frame.payload
        elif frame.kind == "X":
            exit_rec = frame.json()
        elif frame.kind == "E":
            break
    stream.close()
    assert data == b"".join(b"line %d\n" % i for i in range(1000)) + b"\xff raw"
    assert exit_rec["exit_code"] == 3 and not exit_rec["stopped"]
    resumed = host_client.follow(run_id, {0: len(data) - 7}, once=True)
    frame = resumed.next(10)
    assert (frame.kind, frame.offset, frame.payload) == ("L", len(data) - 7, data[-7:])
    resumed.close()


def test_supervisor_stops_the_hosts_other_ranks_when_one_fails(host_client, tmp_path):
    run_id = "20261130-000000-0030"
    host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
    ranks = [(0, [sys.executable, "-c", "import time; time.sleep(60)"]), (1, [sys.executable, "-c", "raise SystemExit(7)"])]
    host_client.start(run_id, spec(run_id, ranks, grace=1.0))
    poll(lambda: host_client.status(run_id)["done"], timeout=10, every=0.1)
    ranks = host_client.status(run_id)["ranks"]
    assert ranks["1"]["exit"]["exit_code"] == 7 and not ranks["1"]["exit"]["stopped"]
    assert ranks["0"]["exit"]["stopped"] and ranks["0"]["exit"]["signal"] == signal.SIGTERM


def test_a_rank_that_cannot_start_gets_exit_127(host_client, tmp_path):
    run_id = "20261130-000000-0031"
    host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
    host_client.start(run_id, spec(run_id, [(0, ["/nonexistent/python", "x.py"])]))
    status = host_client.status(run_id)
    assert status["ranks"]["0"]["exit"]["exit_code"] == 127
    log = (tmp_path / "work" / "runs" / run_id / "rank-0.log").read_text()
    assert "cannot start rank 0 (/nonexistent/python)" in log


def test_free_port_and_the_push_facts(host_client, tmp_path):
    assert 1024 <= host_client.free_port() <= 65535
    facts = host_client.push("20261130-000000-0060", project(tmp_path, {"job.py": b"x"}), hold=False,
                             master_addr="127.0.0.1").facts
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))
    # network: {ifname: auto}: the interface toward rank 0's addr rides with the same answer (net/ifaces.py)
    assert facts["net"]["ifname"] == "lo" and facts["net"]["why"] == "lo holds 127.0.0.1 itself"


def test_missing_python_is_named(tmp_path):
    from dataclasses import replace

    host = replace(make_host(tmp_path / "w"), python=str(tmp_path / "no-python"))
    a = HostClient(host, LocalTransport("here"), Timeouts(command=5))
    with pytest.raises(RemoteCommandError) as info:
        a.free_port()
    assert "no-python" in str(info.value)


def test_cat_reads_only_inside_the_job_folder(host_client, tmp_path):
    run_id = "20261130-000000-0040"
    host_client.push(run_id, project(tmp_path, {"job.py": b"x", "out/metrics.json": b'{"ok": 1}'}), hold=False)
    assert host_client.read_file(run_id, "out/metrics.json") == b'{"ok": 1}'
    with pytest.raises(RemoteCommandError, match="outside the run's job folder"):
        host_client.read_file(run_id, "../spec.json")
    with pytest.raises(RemoteCommandError, match="cannot read out/missing.json"):
        host_client.read_file(run_id, "out/missing.json")


def test_a_controller_gone_before_the_answer_leaves_no_run_folder(host_client, tmp_path):
    """The push's first answer meets a closed pipe (the controller died just then): the run folder the
    host had just made must go again."""
    import json as _json
    import struct
    import subprocess

    host_client.free_port()  # installs the host program
    m = project(tmp_path, {"job.py": b"x", "data/a.bin": os.urandom(1000)})
    wire = _json.dumps({**m.wire(), "hold": True}).encode()
    run_id = "20261130-000000-0050"
    proc = subprocess.Popen(host_client.argv("receive", run_id), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    proc.stdout.close()  # nobody will read the answer
    proc.stdin.write(struct.pack(">I", len(wire)) + wire)
    proc.stdin.close()
    assert proc.wait(20) != 0
    assert not (tmp_path / "work" / "runs" / run_id).exists()


def test_the_stop_answer_carries_the_hosts_clock(host_client, tmp_path):
    run_id = "20261130-000000-0070"
    host_client.push(run_id, project(tmp_path, {"job.py": b"import time; time.sleep(30)\n"}), hold=False)
    host_client.start(run_id, spec(run_id, [(0, [sys.executable, "job.py"])]))
    before = time.time()
    answer = host_client.stop(run_id, 1.0)
    assert before - 1 <= answer["now"] <= time.time() + 1
    assert answer["exits"]["0"]["stopped"] is True


@pytest.mark.parametrize("unsafe", ["world-writable", "foreign-owned"])
def test_a_workdir_others_could_write_to_runs_nothing(tmp_path, unsafe):
    """Issue 21: code found in a workdir that is not the login user's own, or that others may write to,
    never runs: the bootstrap and the installer refuse (exit 96) and the error names the path and the fix."""
    from clusterrun.errors import UnsafeWorkdir

    work = tmp_path / "work"
    work.mkdir()
    if unsafe == "world-writable":
        work.chmod(0o777)
    else:
        os.chown(work, 4321, 4321)  # the tests run as root: another user's folder
    client = HostClient(make_host(work), LocalTransport("here"), Timeouts(command=10))
    with pytest.raises(UnsafeWorkdir) as info:
        client.free_port()
    text = str(info.value)
    assert str(work) in text and ("mode 777" in text if unsafe == "world-writable" else "uid 4321" in text)
    assert "chmod go-w" in text and "workdir:" in text
    assert not (work / "bin").exists()  # the installer did not write into it either


def test_follow_of_a_run_the_host_does_not_have_answers_no_such_run_at_once(host_client, tmp_path):
    import queue

    from clusterrun.hosts.follow import Follower, LogFiles, RunGone

    stream = host_client.follow("20261130-000000-0070", {0: 0})
    frame = stream.next(10)  # a failure frame, not a JSON line read as a frame header
    stream.close()
    assert frame.kind == "F" and frame.json()["kind"] == "missing" and "no such run" in frame.json()["error"]
    host_client.push("20261130-000000-0071", project(tmp_path, {"job.py": b"x"}), hold=False)  # pushed, not started
    frame = host_client.follow("20261130-000000-0071", {0: 0}).next(10)
    assert frame.kind == "F" and frame.json()["kind"] == "missing" and "not started" in frame.json()["error"]
    out: queue.Queue = queue.Queue()
    follower = Follower(node_rank=0, host="here", ranks=[0], files=LogFiles(rank=lambda r: str(tmp_path / "r.log")),
                        world_size=1, attempt_key="20261130-000000-0070", client=lambda reconnect: host_client,
                        out=out, host_lost_s=30)
    t = time.monotonic()
    follower.start()
    ended = out.get(timeout=20)
    assert isinstance(ended, RunGone) and "no such run" in ended.reason
    assert time.monotonic() - t < 10  # no retries until host_lost (30 s here)


def test_the_push_facts_name_the_clusterrun_run_that_holds_the_master_port(host_client, tmp_path):
    holder_run, run_id = "20261130-000000-0080", "20261130-000000-0081"
    port_file = tmp_path / "port"
    code = ("import socket, time; s = socket.socket(); s.bind(('', 0)); s.listen(); "
            f"open({str(port_file)!r}, 'w').write(str(s.getsockname()[1])); time.sleep(60)")
    host_client.push(holder_run, project(tmp_path, {"job.py": b"x"}), hold=False)
    host_client.start(holder_run, {"run_id": holder_run, "grace": 2.0, "fail_fast": True, "ranks": [
        {"rank": 0, "argv": [sys.executable, "-c", code], "env": {"CLUSTERRUN_RUN_ID": holder_run, "RANK": "0"}}]})
    try:
        poll(lambda: port_file.exists() and port_file.read_text(), timeout=20)
        port = int(port_file.read_text())
        facts = host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False, check_port=port).facts
    finally:
        host_client.stop(holder_run, 1.0)
    assert not facts["port"]["free"] and "EADDRINUSE" in facts["port"]["error"]
    holder = facts["port"]["holder"]
    assert (holder["run_id"], holder["rank"]) == (holder_run, 0) and holder["pid"] > 0 and "socket" in holder["command"]


def test_a_master_port_a_starting_run_will_serve_is_not_free(host_client, tmp_path):
    # a run whose rank 0 is still importing torch has not bound its port yet: a second run on the same port
    # would send its workers into the first one's rendezvous
    starting, run_id = "20261130-000000-0090", "20261130-000000-0091"
    port = host_client.free_port()
    host_client.push(starting, project(tmp_path, {"job.py": b"x"}), hold=False)
    host_client.start(starting, {"run_id": starting, "node_rank": 0, "grace": 2.0, "fail_fast": True, "ranks": [
        {"rank": 0, "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
         "env": {"CLUSTERRUN_RUN_ID": starting, "RANK": "0", "MASTER_PORT": str(port)}}]})
    try:
        facts = host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False, check_port=port).facts
    finally:
        host_client.stop(starting, 1.0)
    assert not facts["port"]["free"] and facts["port"]["holder"] == {"run_id": starting, "rank": 0, "starting": True}
    after = host_client.push("20261130-000000-0092", project(tmp_path, {"job.py": b"x"}), hold=False,
                             check_port=port).facts
    assert after["port"]["free"]  # once that run has ended, the port is free again


def test_a_supervisor_that_ended_since_stop_looked_is_no_error(tmp_path):
    """Issue 26, found at 64 hosts: `stop` saw the supervisor alive, then the supervisor ended (it had read
    stop.json, or its ranks had ended) before the TERM: ProcessLookupError crashed the stop on that host.
    Now the ranks are signalled directly, as when the supervisor was already gone."""
    import subprocess

    from clusterrun.remote.host.run import stop

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid names no process any more
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    from clusterrun.remote.host.procs import start_ticks

    try:
        stop._terminate("marker-of-no-process", {0: {"pid": rank.pid, "pgid": rank.pid, "ticks": start_ticks(rank.pid)}},
                        {"pid": gone.pid, "ticks": 1}, sup_alive=True)
        assert rank.wait(timeout=10) == -signal.SIGTERM
    finally:
        rank.kill()


def test_a_rank_starts_with_only_its_three_standard_fds_in_a_session_of_its_own(tmp_path):
    """The supervisor starts ranks by fork and exec (no subprocess import on every host): as Popen with
    close_fds, restore_signals and start_new_session would, nothing but 0-2 is open in the rank (not the
    supervisor's sockets, pipes or log files), SIGPIPE is not ignored, and the rank leads its own session."""
    from clusterrun.remote.host.run.python_launcher import Rank, spawn

    def run(argv, log):
        out = os.open(tmp_path / log, os.O_WRONLY | os.O_CREAT)
        try:
            rank = Rank(spawn(argv, str(tmp_path), dict(os.environ), out))
        finally:
            os.close(out)
        poll(lambda: rank.poll() is not None, timeout=20, every=0.02)
        assert rank.returncode == 0
        return (tmp_path / log).read_text()

    stray = os.open(tmp_path / "held-open", os.O_WRONLY | os.O_CREAT)
    os.set_inheritable(stray, True)  # even an inheritable one
    try:
        said = run([sys.executable, "-c", "import os; fds = sorted(int(f) for f in os.listdir('/proc/self/fd')); "
                                          "print(fds[:3], len(fds), os.getsid(0) == os.getpid())"], "py.log")
        # a Python ignores SIGPIPE again as it starts: what a rank is handed shows in a shell's status
        ignored = run(["sh", "-c", "grep SigIgn /proc/self/status"], "sh.log").split()[1]
    finally:
        os.close(stray)
    assert said.split() == ["[0,", "1,", "2]", "4", "True"]  # 0-2 and listdir's own
    assert not int(ignored, 16) & (1 << (signal.SIGPIPE - 1))
    with pytest.raises(FileNotFoundError):
        spawn([str(tmp_path / "no-such-python"), "-c", "pass"], str(tmp_path), dict(os.environ), 1)


def test_the_push_facts_carry_the_stack_fingerprint_when_asked(host_client, tmp_path):
    """A launch without job.environment compares its hosts' stacks: the fingerprint rides with the push's
    first answer (no round trip of its own); a push that does not ask gets none."""
    held = host_client.push("20261130-000000-0061", project(tmp_path, {"job.py": b"x"}), fingerprint=True)
    try:
        assert held.fingerprint()["python"] == ".".join(map(str, sys.version_info[:3]))
        assert set(held.fingerprint()) >= {"python", "torch", "cuda", "nccl", "cudnn", "driver"}
    finally:
        held.abandon()
    plain = host_client.push("20261130-000000-0062", project(tmp_path, {"job.py": b"x"}), hold=False)
    assert "fingerprint" not in plain.facts
    with pytest.raises(Exception, match="no stack fingerprint"):
        plain.fingerprint()


def test_a_supervisor_loads_ctypes_once_for_all_its_ranks(tmp_path):
    """The death signal (PR_SET_PDEATHSIG) needs (_)ctypes: the supervisor loads it once before its first
    fork, so none of its ranks' forks loads it again between fork and exec (CPU each time, on a host with
    8 ranks 8 times)."""
    import subprocess

    from clusterrun.remote.host import paths, procs

    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(paths.__file__))))  # clusterrun/
    run_dir = tmp_path / "runs" / "20261130-000000-0063"
    os.makedirs(paths.job_dir(str(run_dir)))
    os.makedirs(paths.stacks_dir(str(run_dir)))
    ranks = [{"rank": r, "argv": [sys.executable, "-c", "pass"], "env": {}} for r in range(3)]
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import builtins, json, os, sys, time\n"
        "real = builtins.__import__\n"
        "def traced(name, *a, **k):\n"
        "    if name in ('ctypes', '_ctypes') and name not in sys.modules:\n"
        "        with open(%r, 'a') as fh: fh.write('%%d\\n' %% os.getpid())\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = traced\n"
        "sys.path.insert(0, %r)\n"
        "from remote.host.run.python_launcher import RankSupervisor\n"
        "supervisor = RankSupervisor(%r, {'run_id': '20261130-000000-0063', 'ranks': json.loads(%r)})\n"
        "supervisor.start()\n"
        "while supervisor.procs: supervisor.poll(time.time()); time.sleep(0.01)\n"
        "print(os.getpid(), json.dumps(supervisor.exits))\n"
        % (str(tmp_path / "imports"), src, str(run_dir), json.dumps(ranks)))
    out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    pid, exits = out.stdout.split(" ", 1)
    assert [e["exit_code"] for e in json.loads(exits).values()] == [0, 0, 0]
    assert (tmp_path / "imports").read_text().split() == [pid]  # the supervisor's, once: no rank's fork
    assert procs.death_signal_ready() is not None  # libc's prctl, here on Linux


def test_the_death_signal_is_set_without_loading_ctypes_python_layer(tmp_path):
    """die_with_parent sets PR_SET_PDEATHSIG through _ctypes alone (ctypes' Python layer is ~4 ms of CPU a
    load): the kernel reports SIGKILL as the process's death signal afterwards."""
    import subprocess

    from clusterrun.remote.host import procs

    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(procs.__file__))))  # clusterrun/
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from remote.host import procs\n"
            "procs.die_with_parent()\n"
            "loaded = 'ctypes' in sys.modules\n"
            "import ctypes\n"
            "sig = ctypes.c_int(0)\n"
            "ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG\n"
            "print(loaded, sig.value)\n" % src)
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", str(int(signal.SIGKILL))], out.stderr
