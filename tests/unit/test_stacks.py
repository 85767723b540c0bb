"""Stacks folded and worded (clusterrun/stacks.py), read from faulthandler and py-spy (the host side,
observe/stacks.py, on canned output and on one real py-spy), the hang's verdict, the OOM killer and
NCCL/gloo timeouts in the root cause (outcome.py), the OOM witnesses (run/oom.py), `top`'s samples
(observe/samples.py: /proc files, nvidia-smi's CSV) and its stragglers."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from clusterrun import outcome
from clusterrun import stacks as st
from clusterrun.runs.samples import RankLoad, Sample
from clusterrun.runs.top import stragglers, top_view, TopTarget
from clusterrun.remote.host.observe import samples as S
from clusterrun.remote.host.observe import stacks as H
from clusterrun.remote.host.run import oom
from clusterrun.states import RankState, RunState
from hostkit import make_host
from support import poll

JOB = "/home/cr/.clusterrun/runs/20261201-101010-ab12/job/"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/distributed/"


def frames(*spec):
    return tuple(st.Frame(f, path, line) for f, path, line in spec)


COLLECTIVE = frames(("all_reduce", TORCH + "distributed_c10d.py", 2501), ("wrapper", TORCH + "c10d_logger.py", 81),
                    ("train_step", JOB + "train.py", 88), ("<module>", JOB + "train.py", 120))
LOADER = frames(("slow_loader", JOB + "job.py", 12), ("train_step", JOB + "train.py", 80),
                ("<module>", JOB + "train.py", 120))


def rank(r, host, fr, state="running"):
    return st.RankStack(r, host, 100 + r, state, "faulthandler", (st.ThreadStack("MainThread", "0x1", True, fr),))


def test_where_names_the_innermost_frame_and_the_jobs_own_frame_that_led_there():
    assert st.where(COLLECTIVE) == "all_reduce < train_step (train.py:88)"
    assert st.where(LOADER) == "slow_loader (job.py:12)"
    assert st.where(frames(("wait", "/usr/lib/python3.11/threading.py", 320))) == "wait (threading.py:320)"
    assert st.where(()) == "no stack"
    assert st.short_path(TORCH + "c10d_logger.py") == "torch/distributed/c10d_logger.py"
    assert st.innermost("all_reduce < train_step (train.py:88)") == "all_reduce"


def test_identical_stacks_fold_into_one_group_the_smallest_first():
    stacks = [rank(0, "a0", COLLECTIVE), rank(1, "a1", COLLECTIVE), rank(2, "a3", LOADER), rank(3, "a2", COLLECTIVE)]
    groups = st.fold(stacks)
    assert [g.ranks for g in groups] == [(2,), (0, 1, 3)]
    assert st.headline(groups[0], 4) == "rank 2 (1 of 4) on a3: slow_loader (job.py:12)"
    assert st.headline(groups[1], 4) == "ranks 0-1,3 (3 of 4): all_reduce < train_step (train.py:88)"
    # the same place in another host's job folder is the same stack
    other = frames(*[(f.function, f.file.replace("/home/cr/", "/home/bob/"), f.line) for f in COLLECTIVE])
    assert len(st.fold([rank(0, "a", COLLECTIVE), rank(1, "b", other)])) == 1
    ended = st.fold([rank(0, "a", COLLECTIVE), rank(1, "a", (), state="ended")])
    assert ended[0].ranks == (0,) and ended[1].status == "ended" and ended[1].where == "ended"
    doc = st.to_json("R", stacks, groups, {})
    assert doc["groups"][0]["ranks"] == [2] and doc["groups"][0]["frames"][0]["function"] == "slow_loader"
    assert doc["ranks"][2]["threads"][0]["frames"][0] == {"function": "slow_loader", "file": JOB + "job.py", "line": 12}


def test_the_hang_cause_names_the_odd_rank_in_full_and_the_rest_by_function():
    cause = st.hang_cause([(0, "a0", st.where(COLLECTIVE)), (1, "a1", st.where(COLLECTIVE)),
                           (2, "a3", st.where(LOADER)), (3, "a2", st.where(COLLECTIVE))])
    assert cause == "rank 2 on a3 in slow_loader (job.py:12); ranks 0-1,3 in all_reduce"
    assert st.rank_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def hung_exit(r, fr, **extra):
    return {"rank": r, "exit_code": None, "signal": 15, "stopped": True, "ended_at": time.time(),
            "stop_reason": "hung: no output for 10m", "hung": "hung: no output for 10m",
            "stack": [f.to_json() for f in fr], **extra}


def test_a_hung_run_fails_with_the_odd_rank_as_its_root_cause():
    records = {0: hung_exit(0, COLLECTIVE), 1: hung_exit(1, COLLECTIVE), 2: hung_exit(2, LOADER),
               3: hung_exit(3, COLLECTIVE)}
    hosts = {0: "a0", 1: "a1", 2: "a3", 3: "a2"}
    ranks = [outcome.RankResult.from_exit(r, r, hosts[r], info, clock_offset=0.0) for r, info in records.items()]
    result = outcome.decide("R", ranks)
    assert (result.state, result.exit_code, result.hung) == (RunState.FAILED, 1, True)
    assert result.reason == "hung: no output for 10m; rank 2 on a3 in slow_loader (job.py:12); ranks 0-1,3 in all_reduce"
    assert result.root_cause.rank == 2 and result.root_cause.describe() == "hung in slow_loader (job.py:12)"
    # a rank that died once the hung ranks were stopped (its peer's socket closed) is not the cause
    died = dict(records[3], stopped=False, exit_code=1, signal=None, stop_reason=None, error="")
    ranks[3] = outcome.RankResult.from_exit(3, 3, "a2", died, clock_offset=0.0)
    assert RankState(ranks[3].state) is RankState.FAILED
    assert outcome.decide("R", ranks).reason == result.reason
    # `ps` later reads the ranks back from the registry (note and stop_reason kept): the same verdict
    rows = [dict(r.to_json(), note=r.note, stop_reason=r.stop_reason) for r in ranks]
    assert outcome.decide("R", [outcome.RankResult.from_record(row) for row in rows]).reason == result.reason


def test_a_rank_the_oom_killer_took_says_so():
    info = {"exit_code": None, "signal": 9, "stopped": False, "error": oom.HOST, "ended_at": 1.0}
    r = outcome.RankResult.from_exit(1, 0, "a0", info, clock_offset=0.0)
    assert r.describe() == "killed by the OOM killer (host memory) (SIGKILL)"
    assert outcome.decide("R", [r]).reason == "rank 1 on a0: killed by the OOM killer (host memory) (SIGKILL)"
    plain = outcome.RankResult.from_exit(1, 0, "a0", dict(info, error=""), clock_offset=0.0)
    assert plain.describe() == "killed by signal 9 (SIGKILL)"


KMSG = [(10.0, "Out of memory: Killed process 4242 (python) total-vm:9000kB, anon-rss:8000kB"),
        (20.0, "Memory cgroup out of memory: Killed process 777 (python) total-vm:1kB")]


def test_the_oom_witnesses(tmp_path):
    assert oom.judge(KMSG, 4242, 0) == oom.HOST
    assert oom.judge(KMSG, 777, 0) == oom.CGROUP
    assert oom.judge(KMSG, 1, 0) == ""  # another process: not this rank
    assert oom.judge(KMSG, None, 15.0) == oom.CGROUP  # pid unknown (torchrun): one since the supervisor began
    assert oom.judge(KMSG, None, 30.0) == ""
    assert oom.judge([], 4242, 0) == ""  # /dev/kmsg unreadable (a container): nothing is said
    (tmp_path / "self").write_text("0::/user.slice/run-1.scope\n")
    events = tmp_path / "cg" / "user.slice" / "run-1.scope" / "memory.events"
    events.parent.mkdir(parents=True)
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert oom.cgroup_oom_kills(str(tmp_path / "self"), str(tmp_path / "cg")) == 2
    assert oom.cgroup_oom_kills(str(tmp_path / "missing"), str(tmp_path / "cg")) is None


def hint(*lines):
    return outcome.hint_for(outcome.RankResult(0, 0, "a", RankState.FAILED, exit_code=1, tail=lines))


def test_nccl_and_gloo_timeouts_say_which_collective_and_how_long():
    nccl = hint("[rank1]:[E1201 10:00:00 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum=17, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) "
                "ran for 600058 milliseconds before timing out.")
    assert nccl.startswith("NCCL ALLREDUCE (SeqNum 17) timed out after 600 s"), nccl
    gloo = hint('  File "/x/torch/distributed/distributed_c10d.py", line 4010, in barrier',
                "    work.wait()",
                "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                "1800000ms for recv operation to complete")
    assert gloo.startswith("gloo barrier timed out after 1800 s waiting for a recv"), gloo
    closed = hint("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                  "[198.18.222.12]:40339")
    assert "198.18.222.12:40339 closed its connection" in closed
    assert hint("ValueError: nothing to do with collectives") == ""


# -------------------------------------------------------------- the host side's readers

FAULTHANDLER = """\
clusterrun-stacks pid=10 main=0x00007f0000000001 signal=39
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/home/cr/.clusterrun/bin/host-x/clusterrun_host/run/bootstrap.py", line 90 in _run_file

Current thread 0x00007f0000000001 (most recent call first):
  File "/home/cr/.clusterrun/runs/R/job/job.py", line 12 in slow_loader
  File "/home/cr/.clusterrun/runs/R/job/job.py", line 30 in <module>
  File "/home/cr/.clusterrun/bin/host-x/clusterrun_host/run/bootstrap.py", line 91 in _run_file
  File "/home/cr/.clusterrun/bin/host-x/clusterrun_host/run/bootstrap.py", line 133 in <module>
"""


def test_faulthandlers_dump_is_read_main_thread_named_bootstrap_frames_left_out():
    header = FAULTHANDLER.splitlines()[0]
    assert H.HEADER.match(header).groups() == ("10", "0x00007f0000000001", "39")
    threads = H.parse_faulthandler(FAULTHANDLER, "0x00007f0000000001")
    assert [(t["name"], t["main"]) for t in threads] == [("Thread 0x00007f0000000002", False), ("MainThread", True)]
    assert [f["function"] for f in threads[1]["frames"]] == ["slow_loader", "<module>"]
    assert threads[1]["frames"][0] == {"function": "slow_loader", "file": "/home/cr/.clusterrun/runs/R/job/job.py",
                                       "line": 12}


PY_SPY = json.dumps([
    {"pid": 27911, "thread_id": 140701900290944, "thread_name": "MainThread", "os_thread_id": 27911, "active": False,
     "owns_gil": False, "frames": [
         {"name": "slow_loader", "filename": "/w/runs/R/job/job.py", "module": None, "short_filename": "job.py",
          "line": 4, "locals": None, "is_entry": False},
         {"name": "<module>", "filename": "/w/runs/R/job/job.py", "module": None, "short_filename": "job.py",
          "line": 5, "locals": None, "is_entry": True}], "process_info": None},
    {"pid": 27911, "thread_id": 140701800000000, "thread_name": "pin_memory", "os_thread_id": 27950, "frames": []}])


def test_py_spys_json_is_read():
    threads = H.parse_py_spy(PY_SPY.encode(), 27911)
    assert [(t["name"], t["main"]) for t in threads] == [("MainThread", True), ("pin_memory", False)]
    assert threads[0]["frames"][0] == {"function": "slow_loader", "file": "/w/runs/R/job/job.py", "line": 4}
    assert H.parse_py_spy(b"", 1) == []


def find_py_spy():
    here = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(here, os.X_OK):
        pytest.fail("py-spy is part of the test extra (pip install -e '.[test]'); it is not on PATH or beside "
                    f"{sys.executable}")
    return here


def test_a_real_py_spy_reads_a_live_process(tmp_path):
    """This machine has no Yama: py-spy attaches to a process of the same user."""
    exe = find_py_spy()
    script = tmp_path / "job.py"
    script.write_text("import time\n\ndef slow_loader():\n    print('ready', flush=True)\n    time.sleep(60)\n\n"
                      "slow_loader()\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        got = H.py_spy_dumps(exe, [proc.pid], time.time() + 20)[proc.pid]
        threads, error = got
        assert error == "", got
        assert [f["function"] for f in threads[0]["frames"]] == ["slow_loader", "<module>"]
    finally:
        proc.kill()
        proc.wait()


def test_a_py_spy_that_may_not_attach_falls_back_to_faulthandler(tmp_path, monkeypatch):
    """Yama, or a container without ptrace: py-spy is there but refused; the bootstrap's dump answers."""
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.transport.local import LocalTransport
    from hostkit import project, spec

    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    c = HostClient(make_host(tmp_path / "w"), LocalTransport("w"), Timeouts(command=20))
    run = "20261201-000000-0203"
    code = "import time\ndef slow_loader():\n    time.sleep(60)\nslow_loader()\n"
    c.push(run, project(tmp_path, {"job.py": b"x"}), hold=False)
    c.start(run, spec(run, [(0, [sys.executable, "-c", code])], grace=1.0))
    try:
        time.sleep(1.0)
        (auto,) = st.from_host("w", c.stacks(run))
        assert auto.via == "faulthandler" and auto.main_frames[0].function == "slow_loader", auto
        (spy,) = st.from_host("w", c.stacks(run, via="py-spy"))
        assert spy.threads == () and spy.via == "" and "Permission denied" in spy.error, spy
    finally:
        c.stop(run, 1.0)


def test_stacks_through_the_host_program_force_the_fallback_and_name_it(tmp_path):
    """--via faulthandler (as on a host without py-spy): the bootstrap's dump is what answers."""
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.transport.local import LocalTransport
    from hostkit import project, spec

    c = HostClient(make_host(tmp_path / "w"), LocalTransport("w"), Timeouts(command=20))
    run = "20261201-000000-0201"
    code = textwrap.dedent("""\
        import time
        def slow_loader():
            time.sleep(60)
        slow_loader()
        """)
    c.push(run, project(tmp_path, {"job.py": b"x"}), hold=False)
    c.start(run, spec(run, [(0, [sys.executable, "-c", code]), (1, [sys.executable, "-c", "import sys; sys.exit(0)"])],
                      grace=1.0))
    try:
        time.sleep(1.0)
        answer = c.stacks(run, via="faulthandler")
        by_rank = {s.rank: s for s in st.from_host("w", answer)}
        assert by_rank[0].via == "faulthandler" and by_rank[0].main_frames[0].function == "slow_loader", answer
        assert by_rank[1].state == "ended"
        only = c.stacks(run, ranks=[0], via="faulthandler")
        assert [r["rank"] for r in only["ranks"]] == [0]
    finally:
        c.stop(run, 1.0)


# -------------------------------------------------------------- top

NVIDIA = "0, 45, 1234, 81559\n1, [N/A], 0, 81559\n"


def test_nvidia_smis_csv_is_read():
    assert S.parse_nvidia_smi(NVIDIA) == [
        {"index": 0, "util_pct": 45.0, "mem_used": 1234 << 20, "mem_total": 81559 << 20},
        {"index": 1, "util_pct": None, "mem_used": 0, "mem_total": 81559 << 20}]
    assert S.parse_nvidia_smi("") == []


def test_proc_files_are_read(tmp_path):
    (tmp_path / "stat").write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (tmp_path / "stat2").write_text("cpu  200 0 100 850 50 0 0 0 0 0\n")
    assert S.cpu_pct(S.read_cpu(str(tmp_path / "stat")), S.read_cpu(str(tmp_path / "stat2"))) == 75.0
    (tmp_path / "dev").write_text("Inter-|Receive\n face |bytes\n    lo: 999 0 0 0 0 0 0 0 999 0\n"
                                  "  eth0: 1000 5 0 0 0 0 0 0 2000 7 0 0 0 0 0 0\n")
    assert S.read_net(str(tmp_path / "dev")) == (1000, 2000)
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n")
    assert S.memory(str(tmp_path / "meminfo")) == {"mem_total": 1024000, "mem_used": 614400}
    (tmp_path / "loadavg").write_text("1.50 0.80 0.50 2/300 999\n")
    assert S.load1(str(tmp_path / "loadavg")) == 1.5


def ranks(*cpu_quiet):
    return [RankLoad(i, "running", cpu_pct=c, last_output_s=q) for i, (c, q) in enumerate(cpu_quiet)]


def test_a_rank_far_from_the_others_is_a_straggler():
    assert stragglers(ranks((98, 1), (97, 1), (3, 1), (99, 1))) == {2: "CPU 3% where the others use ~98%"}
    assert stragglers(ranks((50, 1), (50, 2), (50, 90), (50, 1))) == {2: "silent 90 s where the others wrote ~1 s ago"}
    assert stragglers(ranks((99, 1), (0, 1))) == {}  # two ranks: neither is "the others"
    assert stragglers(ranks((1, 1), (2, 1), (0, 2), (1, 1))) == {}  # all idle alike


def test_the_top_view_keeps_every_host_and_rank():
    from dataclasses import replace

    a, b = make_host("/w"), replace(make_host("/v"), name="there")
    targets = [TopTarget(a, "R"), TopTarget(b, "R")]
    sample = {"host": {"cpu_pct": 50.0, "cores": 2, "load1": 1.0, "mem_used": 1, "mem_total": 2, "net_rx": 0,
                       "net_tx": 0, "gpus": None}, "ranks": [{"rank": 1, "state": "running", "cpu_pct": 9.0}]}
    view = top_view("R", targets, {"here": Sample.from_wire("here", sample)})
    doc = view.to_json()
    assert doc["hosts"][0]["cpu_pct"] == 50.0 and doc["ranks"] == [{"rank": 1, "state": "running", "cpu_pct": 9.0,
                                                                    "host": "here", "straggler": ""}]
    assert doc["hosts"][1]["name"] == "there" and doc["hosts"][1]["error"] == "no sample yet"


def test_top_samples_a_run_whose_ranks_ended(tmp_path):
    """Ended ranks are listed with their state (a sample of such a run once failed on them)."""
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.transport.local import LocalTransport
    from hostkit import project, spec

    c = HostClient(make_host(tmp_path / "w"), LocalTransport("w"), Timeouts(command=20))
    run = "20261201-000000-0202"
    c.push(run, project(tmp_path, {"job.py": b"x"}), hold=False)
    c.start(run, spec(run, [(0, [sys.executable, "-c", "print('hi')"]),
                            (1, [sys.executable, "-c", "import time; time.sleep(30)"])], grace=1.0))
    try:
        poll(lambda: (tmp_path / "w" / "runs" / run / "rank-0.exit").exists(), timeout=10)
        samples = c.samples(run, 0.3, 2)
        got = [samples.first, samples.next(10)]
        samples.close()
        for sample in got:
            by_rank = {r["rank"]: r for r in sample["ranks"]}
            assert by_rank[0]["state"] == "ended" and by_rank[1]["state"] == "running", sample
            assert by_rank[1]["rss"] > 0 and by_rank[1]["cpu_pct"] is not None
            assert sample["host"]["mem_total"] > 0 and sample["host"]["cores"] >= 1
        alone = c.samples("-", 0.2, 1)
        assert run in alone.first["runs"] and alone.first["ranks"] == []
        alone.close()
    finally:
        c.stop(run, 1.0)
