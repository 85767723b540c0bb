"""The runner's state machine against fake hosts: order of phases, first failure stops all, lost hosts,
time limit, Ctrl-C, root cause, and what reaches the run record."""

import json
import queue
import threading
import time

from pathlib import Path

import pytest

from clusterrun.errors import EXIT_GPU, AuthError, ConnectError, GpuCheckFailed, HostsBusy, HostsFailed
from clusterrun.events import LogLines, Notice, RankEnded
from clusterrun.hosts.wire import Frame
from clusterrun.hosts.push import PushResult
from clusterrun.config.inventory import parse_inventory
from clusterrun.launch.runner import Runner
from clusterrun.registry.store import RunStore
from clusterrun.remote.host.share import gpu_health
from clusterrun.transport import StreamClosed
from support import wait_for

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "gpu"


def gpu_answer(count, bad=()):
    """A gpu-check answer: `count` GPUs as the canned healthy A100 report has them; those in bad with an
    uncorrectable ECC error."""
    smi = gpu_health.parse_smi_xml((STANDIN / "healthy.xml").read_text())
    gpus = [dict(smi["gpus"][0], index=i, bus_id=f"00000000:{i + 7:02X}:00.0") for i in range(count)]
    for i in bad:
        gpus[i] = dict(gpus[i], volatile={"dram_uncorrectable": "1"})
    return {"smi": dict(smi, gpus=gpus), "xid": {"readable": True, "events": []},
            "op": {"results": [{"index": i, "ok": True, "tflops": 100.0} for i in range(count)]}}


class FakeStream:
    def __init__(self, host):
        self.host = host

    def next(self, timeout):
        try:
            frame = self.host.frames.get(timeout=min(timeout, 0.2))
        except queue.Empty:
            raise TimeoutError from None
        if frame is None:
            raise StreamClosed("gone")
        return frame

    def close(self):
        pass


class FakeHost:
    """Scripted host: the test feeds frames; stop() ends the ranks still running as 'stopped'."""

    def __init__(self, world, name, ranks):
        self.world, self.name, self.ranks = world, name, ranks
        self.frames = queue.Queue()
        self.ended = set()
        self.spec = None
        self.stops = []
        self.reachable_for_stop = True
        self.clock_offset = 0.0
        self.followed_on_push = False  # an attached launch's first attempt: start_following
        self.follow_commands = 0  # `follow` commands asked for (a reconnect, a restart's attempt)

    def log(self, rank, text):
        off = self.world.offsets.get(rank, 0)
        self.world.offsets[rank] = off + len(text)
        self.frames.put(Frame("L", rank, off, text))

    def exit(self, rank, code=None, signal=None, stopped=False, at=None):
        self.ended.add(rank)
        rec = {"rank": rank, "exit_code": code, "signal": signal, "stopped": stopped,
               "ended_at": (at if at is not None else time.time()) + self.clock_offset, "started_at": time.time() - 1}
        self.frames.put(Frame("X", rank, 0, json.dumps(rec).encode()))
        if self.ended >= set(self.ranks):
            self.frames.put(Frame("E", 0, 0, b"{}"))


class FakeHeld:
    def __init__(self, host, result, port, coordinator_port=None, claim=None):
        self.h, self.result, self.port, self.coordinator_port = host, result, port, coordinator_port
        self.facts = {"python": "3.11.2", "executable": "/usr/bin/python3",
                      "fingerprint": {"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": None, "nccl": None,
                                      "cudnn": None, "driver": None}}
        self.claim = claim
        self.wait_port = None

    def start(self, spec):
        self.h.world.calls.append(("start-begin", self.h.name))
        time.sleep(0.05)
        self.h.spec = spec
        self.h.world.calls.append(("start-end", self.h.name))
        return {"supervisor": {"pid": 1}}

    def start_following(self, spec):
        """An attached launch's start: the run's follow frames then come on the push's channel (hosts/push.py)."""
        self.h.followed_on_push = True
        return self.start(spec), FakeStream(self.h)

    def fingerprint(self):
        """The host's stack fingerprint, from the push's facts (hosts/push.py): every fake host has the same one."""
        return dict(self.facts["fingerprint"])

    def abandon(self):
        self.h.world.calls.append(("abandon", self.h.name))


class FakeAgent:
    def __init__(self, host):
        self.h = host

    def push(self, run_id, manifest, progress=lambda n: None, want_port=False, check_port=None, master_addr="",
             relay=None, coordinator=False, claim=None, fingerprint=False):
        self.h.world.calls.append(("push", self.h.name))
        self.h.claim = claim
        granted = None
        if claim is not None:  # as hosts/client.py: the host's answer meets the others' in the group
            request, group, seat = claim
            busy = self.h.world.busy.get(self.h.name)
            info = {"holders": [busy]} if busy else {"granted": self.h.world.gpus.get(self.h.name, [])}
            group.answer(seat, 0, "busy" if busy else "granted", info)
            granted = info
        progress(manifest.total_bytes)
        return FakeHeld(self.h, PushResult(manifest.total_bytes, 1, len(manifest.files), 0.0),
                        41234 if want_port else None, 50000 if coordinator else None, claim=granted)

    def gpu_check(self, request, timeout):
        """The GPU preflight's answer (remote/host/share/gpu_health.py): the world's, else healthy GPUs."""
        self.h.world.calls.append(("gpu-check", self.h.name))
        return self.h.world.gpu_answers.get(self.h.name) or gpu_answer(3)

    def follow(self, run_id, offsets, once=False):
        self.h.follow_commands += 1
        return FakeStream(self.h)

    def free_port(self):
        self.h.world.calls.append(("free-port", self.h.name))
        return 45678

    def start(self, run_id, spec):
        """A restart's start (job.restarts): the job is there, the attempt gets its ranks anew."""
        self.h.world.calls.append(("start-attempt", self.h.name, run_id))
        self.h.ranks, self.h.ended, self.h.spec = [r["rank"] for r in spec["ranks"]], set(), spec
        self.h.world.offsets.clear()
        return {"supervisor": {"pid": 2}, "coordinator": {"port": 50001} if spec["peers"].get("coordinator") else None}

    def stop(self, run_id, grace, reason="stopped"):
        self.h.stops.append(grace)
        self.h.world.calls.append(("stop", self.h.name))
        if not self.h.reachable_for_stop:
            raise ConnectError(self.h.name, "no answer")
        for r in self.h.ranks:
            if r not in self.h.ended:
                self.h.exit(r, signal=15, stopped=True)
        return {}

    def close(self):
        pass


class World:
    def __init__(self, text, tmp_path, fail_connect=()):
        (tmp_path / "train.py").write_text("print('hi')\n")
        self.inv = parse_inventory(text, str(tmp_path / "inv.yaml"))
        self.calls = []
        self.offsets = {}
        rank = 0
        self.hosts = {}
        for h in self.inv.hosts:
            self.hosts[h.name] = FakeHost(self, h.name, list(range(rank, rank + h.slots)))
            rank += h.slots
        self.fail_connect = dict(fail_connect)
        self.store = RunStore(str(tmp_path / "state"))
        self.events = []
        self.busy = {}  # host name -> the claim another run holds there
        self.gpus = {}  # host name -> the GPUs its claim takes
        self.gpu_answers = {}  # host name -> its gpu-check answer (default: 3 healthy GPUs)

    def connect(self, host):
        if host.name in self.fail_connect:
            raise self.fail_connect[host.name]
        return FakeAgent(self.hosts[host.name])

    def runner(self, **kw):
        kw.setdefault("checks", lambda inv, facts: [])
        return Runner(self.inv, "20261130-000000-abcd", store=self.store, connect=self.connect,
                      secrets=kw.pop("secrets", {}), emit=self.events.append, **kw)

    def run_in_thread(self, runner):
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("outcome", runner.run()), daemon=True)
        t.start()
        return t, out

    def wait_started(self, timeout=5):
        wait_for(lambda: all(h.spec for h in self.hosts.values()), timeout, every=0.01, what="every host started")
        time.sleep(0.1)


INV = """\
version: 1
hosts:
  - {name: a, connection: local, workdir: /w/a, slots: 2}
  - {name: b, connection: local, workdir: /w/b}
  - {name: c, connection: local, workdir: /w/c}
job: {script: train.py}
timeouts: {host_lost: 1.5, grace: 2}
"""


def test_success_runs_phases_in_order_and_every_host_starts_at_once(tmp_path):
    w = World(INV, tmp_path)
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    for h in w.hosts.values():
        for r in h.ranks:
            h.log(r, b"hello\n")
            h.exit(r, code=0)
    t.join(10)
    outcome = out["outcome"]
    assert (outcome.state, outcome.exit_code) == ("succeeded", 0)
    kinds = [c for c in w.calls if c[0] != "push"]
    # rank 0's host bound the supervisors' port during the push: nobody waits for its start
    assert {c for c in kinds[:3]} == {("start-begin", "a"), ("start-begin", "b"), ("start-begin", "c")}
    assert w.hosts["b"].spec["peers"]["port"] == 50000 and w.hosts["a"].spec["peers"]["coordinator"]
    assert not any(h.stops for h in w.hosts.values())
    lines = [e for e in w.events if isinstance(e, LogLines)]
    assert sorted((e.host, e.rank, e.data) for e in lines) == [("a", 0, b"hello\n"), ("a", 1, b"hello\n"),
                                                               ("b", 2, b"hello\n"), ("c", 3, b"hello\n")]
    record = w.store.get("20261130-000000-abcd")
    assert record.state == "succeeded" and [r.state for r in record.ranks] == ["succeeded"] * 4
    assert (tmp_path / "state" / "runs" / "20261130-000000-abcd" / "rank-2.log").read_bytes() == b"hello\n"
    # followed on the channel that pushed and started (issue 26): no second command per host
    assert all(h.followed_on_push and h.follow_commands == 0 for h in w.hosts.values())


def test_first_failure_stops_every_host_and_is_the_root_cause(tmp_path):
    w = World(INV, tmp_path)
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    w.hosts["b"].log(2, b"Traceback...\nRuntimeError: boom\n")
    w.hosts["b"].exit(2, code=1)
    t.join(10)
    outcome = out["outcome"]
    assert (outcome.state, outcome.exit_code) == ("failed", 1)
    assert outcome.root_cause.rank == 2 and outcome.root_cause.exit_code == 1
    assert outcome.root_cause.tail[-1] == "RuntimeError: boom"
    assert all(h.stops == [2.0] for h in w.hosts.values())
    assert {r.rank: r.state for r in outcome.ranks} == {0: "stopped", 1: "stopped", 2: "failed", 3: "stopped"}
    assert any(isinstance(e, RankEnded) and e.failed and e.rank == 2 for e in w.events)


def test_root_cause_is_the_earliest_on_the_controllers_clock(tmp_path):
    """Host c's clock runs 100 s ahead; its failure arrives first but happened later."""
    w = World(INV, tmp_path)
    w.hosts["c"].clock_offset = 100.0
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    w.hosts["c"].frames.put(Frame("H", 0, 0, json.dumps({"now": time.time() + 100.0}).encode()))
    w.hosts["b"].frames.put(Frame("H", 0, 0, json.dumps({"now": time.time()}).encode()))
    time.sleep(0.3)
    now = time.time()
    w.hosts["b"].ended.add(2)  # rank 2 failed first, but its record is slow to arrive
    w.hosts["c"].exit(3, code=1, at=now - 0.5)  # arrives first, happened second
    time.sleep(0.1)
    w.hosts["b"].exit(2, code=1, at=now - 1.0)
    t.join(10)
    assert out["outcome"].root_cause.rank == 2


def test_connect_failures_are_all_reported_and_nothing_starts(tmp_path):
    w = World(INV, tmp_path, fail_connect={"a": ConnectError("a", "connection refused"),
                                           "c": AuthError("c", "no key accepted")})
    with pytest.raises(HostsFailed) as info:
        w.runner().run()
    assert set(info.value.failures) == {"a", "c"}
    assert info.value.exit_code == 3
    assert "nothing was started" in str(info.value)
    assert not any(c[0].startswith("start") for c in w.calls)
    record = w.store.get("20261130-000000-abcd")
    assert record.state == "failed" and record.exit_code == 3 and "connection refused" in record.reason


def test_a_silent_host_is_lost_and_the_rest_is_stopped(tmp_path):
    w = World(INV, tmp_path)
    w.hosts["c"].reachable_for_stop = False
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and t.is_alive():  # a and b keep sending heartbeats; c is silent
        for name in ("a", "b"):
            w.hosts[name].frames.put(Frame("H", 0, 0, json.dumps({"now": time.time()}).encode()))
        time.sleep(0.3)
    t.join(10)
    outcome = out["outcome"]
    assert (outcome.state, outcome.exit_code) == ("failed", 1)
    assert outcome.root_cause.host == "c" and outcome.root_cause.state == "lost"
    assert outcome.cleanup_pending == ("c",)
    assert w.hosts["a"].stops and w.hosts["b"].stops
    record = w.store.get("20261130-000000-abcd")
    assert record.cleanup_pending == ["c"]


def test_a_host_rank_0s_supervisor_lost_ends_the_launch_at_once_with_one_story(tmp_path):
    """The attached launch used to wait out host_lost on a host the supervisors' mesh had already lost, and
    told two stories (issue 36): rank 0's heartbeat says which hosts its supervisor lost; the launch takes
    that verdict at once, in the same words for the lost host and for the ranks stopped after it."""
    w = World(INV.replace("host_lost: 1.5", "host_lost: 30"), tmp_path)
    w.hosts["c"].reachable_for_stop = False
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    t0 = time.monotonic()
    w.hosts["a"].frames.put(Frame("H", 0, 0, json.dumps(
        {"now": time.time(), "lost": {"2": "its supervisor closed the connection"}}).encode()))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and t.is_alive():  # a and b stop their ranks and beat; c says nothing
        for name in ("a", "b"):
            w.hosts[name].frames.put(Frame("H", 0, 0, json.dumps({"now": time.time()}).encode()))
        if w.hosts["a"].stops and 0 not in w.hosts["a"].ended:
            w.hosts["a"].exit(0, signal=15, stopped=True)
        if w.hosts["b"].stops and 1 not in w.hosts["b"].ended:
            w.hosts["b"].exit(1, signal=15, stopped=True)
        time.sleep(0.1)
    t.join(10)
    took = time.monotonic() - t0
    outcome = out["outcome"]
    assert took < 6, took  # not the host_lost (30 s here) of c's own silence
    assert outcome.root_cause.host == "c" and outcome.root_cause.state == "lost"
    assert outcome.reason == f"rank {outcome.root_cause.rank} on c: lost (its supervisor closed the connection)"
    from dataclasses import replace

    stopped = replace(next(r for r in outcome.ranks if r.rank == 0), stop_reason="failed")  # as a host records it
    assert stopped.describe(outcome.root_cause) == \
        "stopped by clusterrun after c was lost (its supervisor closed the connection) (SIGTERM)"
    assert outcome.cleanup_pending == ("c",)


def test_time_limit_stops_and_exits_4(tmp_path):
    w = World(INV.replace("job: {script: train.py}", "job: {script: train.py, time_limit: 0.5s}"), tmp_path)
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    t.join(10)
    assert (out["outcome"].state, out["outcome"].exit_code) == ("timed-out", 4)
    assert all(h.stops for h in w.hosts.values())


def test_ctrl_c_stops_gracefully_and_twice_kills(tmp_path):
    w = World(INV, tmp_path)
    runner = w.runner()
    t, out = w.run_in_thread(runner)
    w.wait_started()
    runner.interrupt()
    runner.interrupt()  # within a second: kill at once
    t.join(10)
    assert (out["outcome"].state, out["outcome"].exit_code) == ("interrupted", 130)
    assert all(0.0 in h.stops for h in w.hosts.values())


def test_ctrl_c_during_connect_starts_nothing(tmp_path):
    w = World(INV, tmp_path)
    gate = threading.Event()
    real = w.connect
    w.connect = lambda host: (gate.wait(5), real(host))[1]
    runner = w.runner()
    t, out = w.run_in_thread(runner)
    time.sleep(0.2)
    runner.interrupt()
    t.join(5)
    gate.set()
    assert out["outcome"].exit_code == 130
    time.sleep(0.2)
    assert not any(c[0].startswith("start") for c in w.calls)


def test_auto_port_and_secrets(tmp_path):
    w = World(INV.replace("job: {script: train.py}", "job: {script: train.py}\nmaster: {port: auto}\nsecrets: [TOKEN]"),
              tmp_path)
    t, out = w.run_in_thread(w.runner(secrets={"TOKEN": "hunter2"}))
    w.wait_started()
    env = w.hosts["b"].spec["ranks"][0]["env"]
    assert env["MASTER_PORT"] == "41234" and env["TOKEN"] == "hunter2"
    for h in w.hosts.values():
        for r in h.ranks:
            h.exit(r, code=0)
    t.join(10)
    files = sorted((tmp_path / "state").glob("runs.db*"))  # the WAL holds the newest writes
    assert files and all(b"hunter2" not in f.read_bytes() for f in files)
    assert any(b"20261130-000000-abcd" in f.read_bytes() for f in files)  # the run is in there
    assert json.loads(json.dumps(w.store.get("20261130-000000-abcd").plan))["master_port"] == 41234


def test_the_interface_each_push_found_reaches_that_hosts_ranks_and_the_record(tmp_path, monkeypatch):
    found = {"a": "eth1", "b": "ib0", "c": None}
    plain = FakeHeld.__init__

    def with_net(self, host, *args, **kw):  # what remote/host/net/ifaces.find answers in the push's facts
        plain(self, host, *args, **kw)
        self.facts = {**self.facts, "net": {"ifname": found[host.name], "why": f"{found[host.name]} carries it",
                                            "interfaces": [{"name": "eth1", "addrs": ["10.1.0.9"]}]}}

    monkeypatch.setattr(FakeHeld, "__init__", with_net)
    w = World(INV.replace("connection: local, workdir: /w/c}", "connection: local, workdir: /w/c, "
                                                               "env: {NCCL_SOCKET_IFNAME: eth7}}"), tmp_path)
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    env = {name: h.spec["ranks"][0]["env"] for name, h in w.hosts.items()}
    assert env["a"]["GLOO_SOCKET_IFNAME"] == env["a"]["NCCL_SOCKET_IFNAME"] == "eth1"
    assert env["b"]["GLOO_SOCKET_IFNAME"] == "ib0"
    assert "GLOO_SOCKET_IFNAME" not in env["c"] and env["c"]["NCCL_SOCKET_IFNAME"] == "eth7"  # the user's own
    for h in w.hosts.values():
        for r in h.ranks:
            h.exit(r, code=0)
    t.join(10)
    assert any(isinstance(e, Notice) and e.text == "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME: a eth1, b ib0"
               for e in w.events)
    nodes = w.store.get("20261130-000000-abcd").plan["nodes"]
    assert [n["network"]["ifname"] for n in nodes] == ["eth1", "ib0", None]
    assert w.store.get("20261130-000000-abcd").to_json()["network"]["b"]["why"] == "auto: ib0 carries it"


def test_a_push_failure_drops_what_the_other_hosts_received(tmp_path):
    from clusterrun.errors import PushError

    w = World(INV, tmp_path)
    real = FakeAgent.push

    def push(self, *a, **kw):
        if self.h.name == "c":
            time.sleep(0.1)  # the others have finished and hold their channel by now
            raise PushError("c", "No space left on device", path="/w/c/cache")
        return real(self, *a, **kw)

    FakeAgent.push = push
    try:
        with pytest.raises(HostsFailed) as info:
            w.runner().run()
    finally:
        FakeAgent.push = real
    assert list(info.value.failures) == ["c"] and info.value.exit_code == 1
    assert sorted(c for c in w.calls if c[0] == "abandon") == [("abandon", "a"), ("abandon", "b")]
    assert not any(c[0].startswith("start") for c in w.calls)


def test_a_failed_preflight_check_starts_nothing_and_names_the_host(tmp_path):
    from clusterrun.check.rules import CheckProblem

    w = World(INV, tmp_path)
    problems = [CheckProblem("b", 1, "python", "fail", "Python 3.8 here, 3.11 on a, c", "install the same Python"),
                CheckProblem("c", 2, "disk", "warn", "900 MB free", "")]
    with pytest.raises(HostsFailed) as info:
        w.runner(checks=lambda inv, facts: problems).run()
    assert list(info.value.failures) == ["b"] and "Python 3.8 here" in str(info.value)
    assert not any(c[0].startswith("start") for c in w.calls)
    assert sorted(c for c in w.calls if c[0] == "abandon") == [("abandon", "a"), ("abandon", "b"), ("abandon", "c")]
    assert any("900 MB free" in getattr(e, "text", "") for e in w.events)  # a warning is said as it comes
    assert not any("Python 3.8 here" in getattr(e, "text", "") for e in w.events)  # a failure once: by the error


RESTARTS = """\
version: 1
hosts:
  - {name: a, connection: local, addr: 198.18.7.1, workdir: /w/a, slots: 2}
  - {name: b, connection: local, addr: 198.18.7.2, workdir: /w/b}
  - {name: c, connection: local, addr: 198.18.7.3, workdir: /w/c}
job: {script: train.py, restarts: 1, min_nodes: 2, restart_delay: 0.1s}
timeouts: {host_lost: 1.5, grace: 2}
"""


def beat_until(w, names, done, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        for name in names:
            w.hosts[name].frames.put(Frame("H", 0, 0, json.dumps({"now": time.time()}).encode()))
        time.sleep(0.2)
    assert done()


def test_rank0s_host_lost_the_next_attempt_runs_on_the_rest_with_a_new_master(tmp_path):
    w = World(RESTARTS, tmp_path)
    w.hosts["a"].reachable_for_stop = False
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    beat_until(w, "bc", lambda: any(c[0] == "start-attempt" for c in w.calls))  # a is silent: lost
    beat_until(w, "bc", lambda: w.hosts["c"].spec.get("attempt_key", "").endswith("/attempt-2"))
    b, c = w.hosts["b"], w.hosts["c"]
    assert (b.ranks, c.ranks) == ([0], [1])  # renumbered in node order over the survivors
    env_b, env_c = b.spec["ranks"][0]["env"], c.spec["ranks"][0]["env"]
    assert env_b["MASTER_ADDR"] == env_c["MASTER_ADDR"] == "198.18.7.2"  # rank 0's host moved to b
    assert env_b["MASTER_PORT"] == "45678" and ("free-port", "b") in w.calls
    assert (env_b["WORLD_SIZE"], env_c["RANK"], env_b["CLUSTERRUN_ATTEMPT"]) == ("2", "1", "2")
    assert w.calls.index(("start-attempt", "b", "20261130-000000-abcd/attempt-2")) < \
        w.calls.index(("start-attempt", "c", "20261130-000000-abcd/attempt-2"))  # the new rank 0 first
    assert b.spec["peers"].get("coordinator") and c.spec["peers"]["addr"] == "198.18.7.2"
    b.exit(0, code=0)
    c.exit(1, code=0)
    t.join(10)
    outcome = out["outcome"]
    assert (outcome.state, outcome.exit_code) == ("succeeded", 0)
    assert [(a.attempt, a.hosts, a.world_size) for a in outcome.attempts] == [(0, ("a", "b", "c"), 4),
                                                                             (1, ("b", "c"), 2)]
    assert outcome.attempts[1].dropped == ("a dropped: host lost",)
    assert any("attempt 2/2 on 2 hosts (a dropped: host lost)" in getattr(e, "text", "") for e in w.events)
    record = w.store.get("20261130-000000-abcd")
    assert record.attempt == 1 and record.attempts[0].state == "failed"
    assert "lost" in record.attempts[0].reason and record.attempts[0].hosts == ("a", "b", "c")
    assert [h.name for h in record.hosts if h.cleanup == "pending"] == ["a"]  # `stop` finishes it later


def test_fewer_hosts_than_min_nodes_left_means_no_restart(tmp_path):
    w = World(RESTARTS.replace("min_nodes: 2", "min_nodes: 3"), tmp_path)
    w.hosts["c"].reachable_for_stop = False
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    beat_until(w, "ab", lambda: not t.is_alive())
    outcome = out["outcome"]
    assert (outcome.state, outcome.exit_code) == ("failed", 1) and not outcome.attempts
    assert not any(c[0] == "start-attempt" for c in w.calls)
    assert any("no restart: 2 hosts left, job.min_nodes is 3" in getattr(e, "text", "") for e in w.events)


def test_a_stopped_or_interrupted_run_never_restarts(tmp_path):
    w = World(RESTARTS, tmp_path)
    runner = w.runner()
    t, out = w.run_in_thread(runner)
    w.wait_started()
    runner.interrupt()
    t.join(10)
    assert out["outcome"].exit_code == 130
    assert not any(c[0] == "start-attempt" for c in w.calls)


CLAIMING = INV.replace("workdir: /w/a,", "workdir: /w/a, claims: {dir: /c/a}, gpus: auto,").replace(
    "workdir: /w/b}", "workdir: /w/b, claims: {dir: /c/b}}")


def test_a_busy_host_fails_the_launch_with_exit_5_before_anything_starts(tmp_path):
    w = World(CLAIMING, tmp_path)
    w.busy["b"] = {"kind": "claim", "user": "bob", "by": "bob@laptop", "run": "20261130-235959-beef", "node": "b",
                   "slots": 1, "gpus": [], "since": time.time(), "state": "running"}
    with pytest.raises(HostsBusy) as info:
        w.runner().run()
    assert info.value.exit_code == 5 and list(info.value.failures) == ["b"]  # a, free, is not blamed
    assert "held by bob (bob@laptop) run 20261130-235959-beef" in str(info.value)
    assert not any(c[0].startswith("start") for c in w.calls)
    assert ("abandon", "c") in w.calls  # c (no claims) had its push: dropped; a's claim went with its stream
    record = w.store.get("20261130-000000-abcd")
    assert (record.state, record.exit_code) == ("failed", 5)


def test_the_gpus_a_host_claimed_reach_its_ranks_and_its_supervisor(tmp_path):
    w = World(CLAIMING, tmp_path)
    w.gpus["a"] = [3, 5]
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    spec = w.hosts["a"].spec
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in spec["ranks"]] == ["3,5", "3,5"]
    assert spec["claim"]["taken_gpus"] == [3, 5] and spec["claim"]["dir"] == "/c/a"
    assert "claim" in w.hosts["b"].spec and "claim" not in w.hosts["c"].spec  # c: claims off (local)
    for h in w.hosts.values():
        for r in h.ranks:
            h.exit(r, code=0)
    t.join(10)
    assert out["outcome"].exit_code == 0


# ------------------------------------------------------------------ the GPU preflight (launch/gpu_gate.py)


def test_gpu_preflight_leaves_a_failing_gpu_out_of_the_claim_and_says_so(tmp_path):
    w = World(CLAIMING, tmp_path)  # a: gpus auto, 2 slots
    w.gpu_answers["a"] = gpu_answer(3, bad=[1])
    w.gpus["a"] = [0, 2]
    t, out = w.run_in_thread(w.runner())
    w.wait_started()
    request = w.hosts["a"].claim[0]
    assert request["gpus"] == [0, 2] and request["gpu_count"] == 2  # the claim chooses among the healthy ones
    assert [c for c in w.calls if c[0] == "gpu-check"] == [("gpu-check", "a")]  # b, c: no GPUs
    assert w.calls.index(("gpu-check", "a")) < w.calls.index(("push", "a"))
    texts = [e.text for e in w.events if isinstance(e, Notice)]
    assert ("GPU preflight: a GPU 1 skipped: 1 uncorrectable ECC error since the driver loaded (volatile "
            "dram_uncorrectable); the run uses GPUs 0,2 there") in texts
    for h in w.hosts.values():
        for r in h.ranks:
            h.exit(r, code=0)
    t.join(10)
    assert out["outcome"].exit_code == 0


def test_gpu_preflight_failure_exits_6_before_any_host_is_pushed(tmp_path):
    w = World(CLAIMING, tmp_path)
    w.gpu_answers["a"] = gpu_answer(2, bad=[1])  # 2 slots, 2 GPUs: nothing to fall back on
    with pytest.raises(HostsFailed) as info:
        w.runner().run()
    assert info.value.exit_code == EXIT_GPU and list(info.value.failures) == ["a"]
    assert isinstance(info.value.failures["a"], GpuCheckFailed)
    assert str(info.value).startswith("GPU preflight failed on 1 host; nothing was started:")
    assert "a GPU 1: 1 uncorrectable ECC error since the driver loaded" in str(info.value)
    assert not any(c[0] in ("push", "start-begin") for c in w.calls)  # b and c waited, then stopped too
    record = w.store.get("20261130-000000-abcd")
    assert (record.state, record.exit_code) == ("failed", EXIT_GPU)
