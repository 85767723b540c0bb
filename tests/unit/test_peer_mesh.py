"""The supervisors' peer mesh (remote/host/run/peers.py) under attack, issue 21: anyone who can reach a
port must not be able to stop, stall or steer a run. Random bytes, lines, deeply nested JSON, wrong and
non-ASCII MACs, forged messages and a flood of idle connections are thrown at a live coordinator and at a
live peer; both must survive, keep their run, and act on nothing a forged message says. Last, the same
against real supervisors on this machine: the time limit, the exit records and the secret scrub hold."""

import json
import os
import socket
import sys
import threading
import time
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterrun.remote.host.run import peers as P
from hostkit import project
from support import wait_for

TOKEN = "a" * 32
RUN = "20261201-000000-0001"


def conf(**extra):
    return {"token": TOKEN, "host_lost": 3.0, "join_timeout": 30.0, "run": RUN, "bind": "127.0.0.1", **extra}


class Ticker:
    """Ticks the mesh's sides as their supervisors would (every 20 ms); whatever they raise is kept: it
    would have killed a supervisor."""

    def __init__(self, *sides):
        self.sides, self.raised, self.halt = sides, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.halt.is_set():
            for side in self.sides:
                try:
                    side.tick(time.time())
                except BaseException as exc:  # noqa: B036 (the point: nothing may escape a tick)
                    self.raised.append(repr(exc))
            time.sleep(0.02)

    def stop(self):
        self.halt.set()
        self.thread.join(5)


wait_until = partial(wait_for, timeout=10.0, every=0.02)  # this module's pace: threads on loopback


@pytest.fixture(scope="module")
def live_mesh():
    """A coordinator and its one real peer on loopback, joined, ticking for the whole module."""
    logs = []
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.1"]), logs.append)
    peer = P.Peer(conf(addr="127.0.0.1", port=coordinator.port), 1, logs.append)
    ticker = Ticker(coordinator, peer)
    assert wait_until(lambda: peer.authenticated and 1 in coordinator.peers)
    yield coordinator, peer, ticker, logs
    ticker.stop()
    coordinator.close()
    peer.close()


def attack(port, payload, linger=0.05):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return
    try:
        s.settimeout(0.5)
        try:
            s.recv(4096)  # the challenge
        except OSError:
            pass
        s.sendall(payload)
        time.sleep(linger)
    except OSError:
        pass
    finally:
        s.close()


def line(obj):
    return (json.dumps(obj) + "\n").encode()


NASTY = [
    line({"hello": 1, "nonce": "0" * 32, "done": False, "mac": "\u00e9" * 64}),  # non-ASCII MAC (it was a TypeError)
    b"[" * 100000 + b"\n",  # deep nesting (it was a RecursionError)
    b"[" * 500 + b"]" * 500 + b"\n",
    line({"hello": 1, "nonce": "0" * 32, "done": False, "mac": "0" * 64}),  # the right shape, a wrong proof
    line({"hello": True, "mac": None}),
    line({"hello": 99, "nonce": 5, "done": "yes", "mac": ["x"]}),
    line({"failed": {"rank": 0}}) + line({"done": 1}),  # forged words, never authenticated
    line({"stop": "now"}),
    line({"beat": 1.0, "quiet": 99999}) + line({"dumped": 1}),  # hang watch words, never authenticated
    b"\xff\xfe\x00garbage\n" * 10,
    b"x" * 70000,  # one line without end
    b"",
]


def test_named_attacks_leave_the_coordinator_and_its_peer_untouched(live_mesh):
    coordinator, peer, ticker, _ = live_mesh
    for payload in NASTY:
        attack(coordinator.port, payload)
    time.sleep(0.3)
    assert ticker.raised == []
    assert coordinator.failure is None and coordinator.stop_reason is None and peer.stop_reason is None
    assert 1 in coordinator.peers and not coordinator.peers[1].closed and peer.authenticated
    assert len(coordinator.pending) <= P.MAX_PENDING


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
                           st.text(max_size=20), lambda kids: st.lists(kids, max_size=4) |
                           st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)
messages = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: line(v)),
    st.fixed_dictionaries({"hello": st.integers(-2, 3), "nonce": st.text(max_size=40), "done": st.booleans(),
                           "mac": st.text(max_size=80)}).map(line),
    st.sampled_from(NASTY),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(messages, min_size=1, max_size=4))
def test_random_input_at_the_coordinator_changes_nothing(live_mesh, payloads):
    coordinator, peer, ticker, _ = live_mesh
    attack(coordinator.port, b"".join(payloads), linger=0.01)
    assert ticker.raised == []
    assert coordinator.failure is None and coordinator.stop_reason is None


def test_a_flood_of_idle_connections_is_capped_and_the_peer_stays_joined(live_mesh):
    coordinator, peer, ticker, _ = live_mesh
    held = []
    for _ in range(200):
        try:
            held.append(socket.create_connection(("127.0.0.1", coordinator.port), timeout=1))
        except OSError:
            break
    time.sleep(0.3)
    assert len(coordinator.pending) <= P.MAX_PENDING
    assert wait_until(lambda: not coordinator.pending, timeout=P.HELLO_TIMEOUT + 2)  # each gets a short deadline
    for s in held:
        s.close()
    assert ticker.raised == [] and 1 in coordinator.peers and coordinator.failure is None


def test_the_real_peer_is_still_heard_after_all_that(live_mesh):
    coordinator, peer, ticker, _ = live_mesh
    peer.send({"failed": {"rank": 3, "exit_code": 1, "signal": None}})
    # in ps's words (remote/host/words.py), the node by its host name when the controller gave the names
    assert wait_until(lambda: coordinator.failure == "rank 3 on node 1: exit code 1")
    coordinator.stop("failed elsewhere: " + coordinator.failure)
    assert wait_until(lambda: peer.stop_reason == "failed elsewhere: rank 3 on node 1: exit code 1")
    assert ticker.raised == []


class FakeCoordinator:
    """A listening socket that plays rank 0's host without the token: whatever a test makes it say."""

    def __init__(self):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.port = self.server.getsockname()[1]
        self.conns = []

    def serve(self, script):
        """Accept the peer's next connection and send it the script (bytes), after the peer's hello."""
        self.server.settimeout(5)
        conn, _ = self.server.accept()
        self.conns.append(conn)
        conn.sendall(line({"challenge": os.urandom(16).hex()}))
        conn.settimeout(2)
        try:
            conn.recv(4096)  # the hello: a proof over our nonce, useless anywhere else
        except OSError:
            pass
        conn.sendall(script)

    def close(self):
        for c in self.conns:
            c.close()
        self.server.close()


FORGED = [
    line({"welcome": 1}) + line({"stop": {"reason": "forged"}}),  # no proof (the old protocol stopped here)
    line({"welcome": 1, "mac": "0" * 64}) + line({"stop": {"reason": "forged"}}),
    line({"welcome": 1, "mac": "\u00e9" * 64}),
    line({"stop": {"reason": "forged"}}),
    line({"stop": "not a dict"}),
    line({"stop": {"reason": ["x"]}}),
    line({"welcome": 1, "mac": "0" * 64}) + line({"dump": {"reason": "forged"}}),  # no stacks for a stranger
    line({"dump": {"reason": "forged"}}),
    b"[" * 100000 + b"\n",
    b"\xff\n",
]


@pytest.mark.parametrize("script", FORGED)
def test_a_fake_coordinator_cannot_stop_or_crash_a_peer(script):
    fake = FakeCoordinator()
    peer = P.Peer(conf(addr="127.0.0.1", port=fake.port), 1, lambda text: None)
    ticker = Ticker(peer)
    try:
        fake.serve(script)
        time.sleep(0.5)
        assert ticker.raised == []
        assert peer.stop_reason is None and peer.dump_reason is None and not peer.authenticated
    finally:
        ticker.stop()
        peer.close()
        fake.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=3))
def test_random_words_from_a_fake_coordinator_change_nothing(payloads):
    fake = FakeCoordinator()
    peer = P.Peer(conf(addr="127.0.0.1", port=fake.port), 1, lambda text: None)
    ticker = Ticker(peer)
    try:
        fake.serve(b"".join(payloads))
        time.sleep(0.15)
        assert ticker.raised == [] and peer.stop_reason is None
    finally:
        ticker.stop()
        peer.close()
        fake.close()


def test_the_hang_watchs_words_are_type_checked_and_a_dump_reaches_the_peer():
    """A joined peer's quiet is heard; a quiet that is not a number drops that connection (and nothing
    else: the peer joins again); the coordinator's dump request reaches the peer, whose dumped answer is
    heard."""
    logs = []
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.1"]), logs.append)
    peer = P.Peer(conf(addr="127.0.0.1", port=coordinator.port), 1, logs.append)
    peer.quiet = lambda now: 42.0
    ticker = Ticker(coordinator, peer)
    try:
        assert wait_until(lambda: coordinator.quiet_of(1, time.time()) is not None)
        assert 42.0 <= coordinator.quiet_of(1, time.time()) < 45.0
        coordinator.dump("hung: no output for 10m")
        assert wait_until(lambda: peer.dump_reason == "hung: no output for 10m")
        peer.send({"dumped": 1})
        assert wait_until(lambda: coordinator.dumped == {1})
        for bad in ({"beat": 1.0, "quiet": "soon"}, {"beat": 1.0, "quiet": -1}, {"beat": 1.0, "quiet": True},
                    {"dumped": 7}):
            joined = coordinator.peers[1]
            peer.line.send(bad)
            assert wait_until(lambda joined=joined: joined.closed, what=f"the connection closed after {bad}"), bad  # that connection goes; the peer joins again
            assert wait_until(lambda: 1 in coordinator.peers and not coordinator.peers[1].closed and peer.authenticated)
        assert ticker.raised == []
    finally:
        ticker.stop()
        coordinator.close()
        peer.close()


def test_a_silent_coordinator_is_a_lost_host_after_host_lost():
    """Rank 0's host frozen (TCP open, nothing answers): the peer stops its ranks after host_lost, not after
    TCP's 15 minutes (issue 21, finding 4; the container test freezes a real host)."""
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.1"], host_lost=1.0), print)
    peer = P.Peer(conf(addr="127.0.0.1", port=coordinator.port, host_lost=1.0), 1, lambda text: None)
    ticker = Ticker(coordinator, peer)
    try:
        assert wait_until(lambda: peer.authenticated)
        ticker.sides = (peer,)  # the coordinator freezes: its socket stays open, it says nothing
        t = time.monotonic()
        assert wait_until(lambda: peer.stop_reason is not None, timeout=5)
        assert 0.8 < time.monotonic() - t < 3 and "lost contact with rank 0's host" in peer.stop_reason
    finally:
        ticker.stop()
        coordinator.close()
        peer.close()


def test_only_the_runs_hosts_get_in():
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.2"]), lambda text: None)
    try:
        s = socket.create_connection(("127.0.0.1", coordinator.port), timeout=2)  # from 127.0.0.1: not a host
        s.settimeout(1)
        coordinator.tick(time.time())
        assert s.recv(100) == b"" and not coordinator.pending  # closed before a challenge
        s.close()
        ok = socket.create_connection(("127.0.0.1", coordinator.port), timeout=2, source_address=("127.0.0.2", 0))
        ok.settimeout(1)
        coordinator.tick(time.time())
        assert b"challenge" in ok.recv(100)
        ok.close()
    finally:
        coordinator.close()


# -------------------------------------------------------------- real supervisors under attack


def start_node(host_client, tmp_path, node, peers, secret, time_limit=6.0):
    run = "20261201-000000-00%02d" % 40
    code = ("import os, sys, time; print('token', os.environ['TOKEN'], flush=True); time.sleep(120)")
    host_client.push(run, project(tmp_path / f"p{node}", {"job.py": b"x"}), hold=False)
    spec = {"attempt_key": run, "run_id": run, "node_rank": node, "node": f"n{node}", "grace": 1.0, "fail_fast": True,
            "time_limit": time_limit, "secret_names": ["TOKEN"], "peers": peers,
            "ranks": [{"rank": node, "argv": [sys.executable, "-c", code],
                       "env": {"PYTHONUNBUFFERED": "1", "TOKEN": secret}}]}
    return run, host_client.start(run, spec)


def test_real_supervisors_keep_the_time_limit_records_and_scrub_under_attack(tmp_path):
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.transport.local import LocalTransport
    from hostkit import make_host

    secret = "s3cr3t-" + os.urandom(4).hex()
    a = HostClient(make_host(tmp_path / "a"), LocalTransport("a"), Timeouts(command=20))
    b = HostClient(make_host(tmp_path / "b"), LocalTransport("b"), Timeouts(command=20))
    common = {"token": TOKEN, "host_lost": 6.0, "join_timeout": 20.0, "run": "20261201-000000-0040",
              "bind": "127.0.0.1"}
    t0 = time.monotonic()
    run, state = start_node(a, tmp_path, 0, {**common, "coordinator": True, "expect": [1], "allow": ["127.0.0.1"]},
                            secret)
    port = state["coordinator"]["port"]
    start_node(b, tmp_path, 1, {**common, "addr": "127.0.0.1", "port": port}, secret)
    held = [socket.create_connection(("127.0.0.1", port), timeout=1) for _ in range(60)]  # the fd flood
    for payload in NASTY:
        attack(port, payload)
    try:
        folders = [tmp_path / w / "runs" / run for w in ("a", "b")]
        assert wait_until(lambda: all((f / "done.json").exists() for f in folders), timeout=30)
        took = time.monotonic() - t0
        assert took < 6 + 1 + 8, took  # the time limit held (plus the grace and slack for this loaded machine)
        for folder, rank in zip(folders, (0, 1)):
            record = json.loads((folder / f"rank-{rank}.exit").read_text())
            assert record["stopped"] and record["stop_reason"] == "time-limit", record
            for path in folder.rglob("*"):
                if path.is_file() and "job" not in path.relative_to(folder).parts:
                    assert secret.encode() not in path.read_bytes(), path
        log = (folders[0] / "supervisor.log").read_text()
        assert "Traceback" not in log
    finally:
        for s in held:
            s.close()
        a.close()
        b.close()


def test_a_peer_whose_ranks_failed_before_it_ever_connected_still_tells_the_coordinator():
    """A host whose ranks all fail within its first tick (a bad import, a typo) must still join, tell its
    failure and say done before its supervisor exits: else rank 0's host never hears of it and waits out
    join_timeout while the others run on."""
    logs = []
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.1"]), logs.append)
    peer = P.Peer(conf(addr="127.0.0.1", port=coordinator.port), 1, logs.append)
    ticker = Ticker(coordinator)
    try:
        peer.report({"rank": 1, "exit_code": 1})  # before any tick: never connected
        t = time.monotonic()
        peer.finish(time.time() + 5.0)
        assert time.monotonic() - t < 4.0
        assert wait_until(lambda: 1 in coordinator.done and coordinator.failure is not None, timeout=3), logs
        assert "rank 1 on node 1: exit code 1" in coordinator.failure
        assert not coordinator.waiting(time.time())
    finally:
        ticker.stop()
        coordinator.close()
        peer.close()


def test_a_peer_whose_supervisor_dies_is_named_lost_by_name_in_rank_0s_state_and_heartbeat(tmp_path):
    """Rank 0's host's supervisor loses a peer (SIGKILL of its supervisor: the mesh connection closes):
    state.json's "mesh" and the follow heartbeat say which host and why, by the name the controller gave,
    so an attached launch ends at once instead of waiting out that host's own silence (issue 36)."""
    import signal

    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.transport.local import LocalTransport
    from hostkit import make_host

    a = HostClient(make_host(tmp_path / "a"), LocalTransport("a"), Timeouts(command=20))
    b = HostClient(make_host(tmp_path / "b"), LocalTransport("b"), Timeouts(command=20))
    common = {"token": TOKEN, "host_lost": 30.0, "join_timeout": 20.0, "run": "20261201-000000-0040",
              "bind": "127.0.0.1", "names": {"0": "alpha", "1": "beta"}}
    # a time limit past the kill + the rejoin grace (peers.REJOIN_S): the loss, not the limit, ends it
    run, state = start_node(a, tmp_path, 0, {**common, "coordinator": True, "expect": [1], "allow": ["127.0.0.1"]},
                            "s3cr3t-xyz", time_limit=20.0)
    start_node(b, tmp_path, 1, {**common, "addr": "127.0.0.1", "port": state["coordinator"]["port"]}, "s3cr3t-xyz",
               time_limit=20.0)
    folder_a, folder_b = (tmp_path / w / "runs" / run for w in ("a", "b"))
    try:
        time.sleep(3.0)  # the peer joins over loopback in well under that
        os.kill(json.loads((folder_b / "state.json").read_text())["supervisor"]["pid"], signal.SIGKILL)

        def lost():
            return (json.loads((folder_a / "state.json").read_text()).get("mesh") or {}).get("lost")

        assert wait_until(lambda: lost() == {"1": "its supervisor closed the connection"}, timeout=10), \
            (folder_a / "supervisor.log").read_text()
        stream = a.follow(run, {0: 0})
        beats = []
        while not beats:
            frame = stream.next(10)
            if frame.kind == "H":
                beats.append(json.loads(frame.payload))
        stream.close()
        assert beats[0]["lost"] == {"1": "its supervisor closed the connection"}
        # the ranks it stopped say the same story, by host name (words.py)
        assert wait_until(lambda: (folder_a / "rank-0.exit").exists(), timeout=20)
        record = json.loads((folder_a / "rank-0.exit").read_text())
        assert record["stop_reason"] == "failed elsewhere: beta lost (its supervisor closed the connection)", record
    finally:
        a.stop(run, 1.0)
        b.stop(run, 1.0)
        a.close()
        b.close()
