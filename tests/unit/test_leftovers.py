"""Leftovers on this machine, for real: processes holding stand-in GPU device files (any path the check is
told to treat as /dev/nvidia*), labelled by the process marker, and `kill` ending exactly an ended run's."""

import json
import os
import subprocess
import sys

import pytest

from clusterrun.check.gpu_rules import holder_text, judge_host
from clusterrun.hosts.leftovers import Leftover
from clusterrun.remote.host.procs import MARKER_ENV, end_members, same_process, start_ticks
from clusterrun.remote.host.share import leftovers
from support import wait_for

ENDED, LIVE, MINE = "20261202-100000-aaaa", "20261202-110000-bbbb", "20261202-120000-cccc"
HOLD = "import sys, time; f = open(sys.argv[1]); print('up', flush=True); time.sleep(120)"


@pytest.fixture
def machine(tmp_path):
    """A workdir with three runs' folders (ENDED: its supervisor gone; LIVE: this test's process as its
    supervisor) and stand-in device files; spawn(device, marker) starts a holder in a session of its own."""
    workdir = tmp_path / "w"
    for run, sup in ((ENDED, {"pid": 2 ** 22 - 3, "ticks": 1}), (LIVE, {"pid": os.getpid(),
                                                                        "ticks": start_ticks(os.getpid())})):
        folder = workdir / "runs" / run
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"supervisor": sup}))
    for i in range(4):
        (tmp_path / f"nvidia{i}").write_text("")
    procs = []

    def spawn(device, marker=None):
        env = dict(os.environ, **({MARKER_ENV: marker} if marker else {}))
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / device)], env=env, stdout=subprocess.PIPE,
                             start_new_session=True)
        assert p.stdout.readline() == b"up\n"
        procs.append(p)
        return p

    spawn.workdir, spawn.devices = str(workdir), str(tmp_path / "nvidia*")
    yield spawn
    for p in procs:
        p.kill()
        p.wait()


def test_every_holder_is_found_and_labelled(machine):
    ended = machine("nvidia0", f"{ENDED}/node0")
    live = machine("nvidia1", f"{LIVE}/node0")
    mine = machine("nvidia2", f"{MINE}/attempt-1/node0")
    unknown = machine("nvidia3")
    holders, _ = leftovers.scan(machine.workdir, {"devices": machine.devices, "run": MINE})
    by_pid = {h["pid"]: h for h in holders}
    assert {p.pid: by_pid[p.pid]["label"] for p in (ended, live, mine, unknown)} == {
        ended.pid: "ended-run", live.pid: "live-run", mine.pid: "this-run", unknown.pid: "unknown"}
    e = by_pid[ended.pid]
    assert (e["run"], e["node"], e["gpus"], e["user"]) == (ENDED, "node0", [0], os.environ.get("USER", e["user"]))
    assert e["devices"] == [machine.devices.replace("*", "0")] and "time.sleep(120)" in e["command"]
    assert by_pid[mine.pid]["run"] == MINE and by_pid[unknown.pid]["run"] == ""


def test_kill_ends_exactly_the_ended_runs_marked_holders(machine):
    ended = machine("nvidia0", f"{ENDED}/node0")
    ended2 = machine("nvidia1", f"{ENDED}/node1")  # the same run's other node on this machine
    live = machine("nvidia2", f"{LIVE}/node0")
    unknown = machine("nvidia3")  # an unmarked process on the same kind of device: never touched
    holders, _ = leftovers.scan(machine.workdir, {"devices": machine.devices})
    killed = leftovers.kill(holders, ENDED, grace=2.0)
    assert sorted(killed) == sorted([ended.pid, ended2.pid])
    for p in (ended, ended2):
        assert p.wait(5) == -15  # TERM was enough
    assert live.poll() is None and unknown.poll() is None
    holders, _ = leftovers.scan(machine.workdir, {"devices": machine.devices})
    assert leftovers.kill(holders, "20261202-000000-dddd", grace=0.1) == []  # another run's: nothing
    assert leftovers.kill(holders, "*", grace=0.1) == [] and live.poll() is None and unknown.poll() is None


def test_the_labels_rule_claims_and_what_may_be_killed():
    live = {"k": True}
    label = leftovers.label
    assert label({"marker": f"{ENDED}/n"}, "", lambda key: False, {}) == "ended-run"
    assert label({"marker": f"{LIVE}/attempt-2/n"}, "", lambda key: key == f"{LIVE}/attempt-2", {}) == "live-run"
    assert label({"marker": f"{MINE}/n"}, MINE, lambda key: False, {}) == "this-run"
    other = os.getuid() + 1
    assert label({"uid": other}, "", live.get, {other: LIVE}) == "claim"
    assert label({"uid": other}, "", live.get, {}) == "unknown"
    assert label({"uid": os.getuid()}, "", live.get, {os.getuid(): LIVE}) == "unknown"  # ours would be marked
    mine = {"label": "ended-run", "uid": os.getuid(), "marker": f"{ENDED}/n", "run": ENDED}
    assert leftovers.killable(mine, ENDED) and leftovers.killable(mine, "*") and not leftovers.killable(mine, LIVE)
    assert not leftovers.killable(dict(mine, uid=other), ENDED)  # another user's: never
    assert not leftovers.killable(dict(mine, label="unknown", marker=""), "*")
    assert leftovers.split_marker(f"{LIVE}/attempt-2/node3") == (LIVE, f"{LIVE}/attempt-2", "node3")


def test_end_members_reaches_a_marked_process_that_left_its_group(tmp_path):
    (tmp_path / "dev").write_text("")
    env = dict(os.environ, **{MARKER_ENV: f"{ENDED}/node0"})
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "dev")], env=env, stdout=subprocess.PIPE,
                         start_new_session=True)
    assert p.stdout.readline() == b"up\n"
    ticks = start_ticks(p.pid)
    assert end_members(f"{ENDED}/node0", 2.0) == [p.pid]
    assert p.wait(5) == -15 and not same_process(p.pid, ticks)
    assert end_members(f"{ENDED}/node0", 0.1) == []


def test_holders_become_warnings_on_the_gpu_they_hold(machine):
    from test_gpu_preflight import answer

    machine("nvidia1", f"{ENDED}/node0")
    holders, _ = leftovers.scan(machine.workdir, {"devices": machine.devices})
    h = judge_host("node0", "auto", dict(answer(), holders=holders))
    assert h.gpus[0].status == "ok" and h.gpus[1].status == "warn"
    assert h.gpus[1].warnings[0].startswith("held by pid ") and h.gpus[1].warnings[0].endswith(
        f"left by ended run {ENDED}: `clusterrun clean --leftovers {ENDED}` ends it")
    x = Leftover.from_wire("node0", holders[0], killed=[holders[0]["pid"]])
    assert x.killed and x.label == "ended-run" and x.gpus == (1,) and x.text() == holder_text(holders[0])
    assert holder_text({"pid": 7, "user": "bob", "command": "python x.py", "label": "unknown"}) == \
        "pid 7 (python x.py, user bob) not a clusterrun run's"


def test_the_leftovers_command_answers_one_json_line(machine):
    p = machine("nvidia0", f"{ENDED}/node0")
    host = os.path.join(os.path.dirname(leftovers.__file__), "..", "..")
    done = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                           "from host.main import main; sys.exit(main(sys.argv[1:]))", os.path.abspath(host),
                           machine.workdir, "leftovers"], input=json.dumps(
                               {"devices": machine.devices, "kill": ENDED, "grace": 2}).encode(),
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.decode().splitlines()[-1])
    assert answer["killed"] == [p.pid] and answer["holders"][0]["label"] == "ended-run"
    wait_for(lambda: p.poll() is not None, timeout=5)
