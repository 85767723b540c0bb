"""Issue 32 on the supervisors' mesh (remote/host/run/peers.py, its door and lines in remote/host/channel/),
over loopback, where 127.0.0.2 and 127.0.0.3 stand for two of a run's hosts:
  - finding 3: connections from an allowed address (another user on one of the run's hosts) cannot keep
    the real peer out, and a node that never joined by join_timeout is recorded, and counted as a lost
    host when no controller follows the run;
  - finding 7: after the handshake every line carries a MAC: a line injected into the TCP stream (a
    forged stop, a replayed or reflected one, random bytes) is dropped and logged, and the mesh goes on.
The detached waiters (share/waiter.py) open the same door and seal the same way (channel/gate.py)."""

import json
import select
import socket
import sys
import threading
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterrun.remote.host.run import peers as P
from hostkit import project
from support import poll
from test_peer_mesh import Ticker, line, messages, wait_until

TOKEN = "a" * 32
RUN = "20261201-000000-0032"


def conf(**extra):
    return {"token": TOKEN, "host_lost": 5.0, "join_timeout": 30.0, "run": RUN, **extra}


class Flood:
    """Another user on one of the run's hosts: opens `count` idle connections to a port from `source` and
    holds them; with refill, opens a new one whenever one is closed."""

    def __init__(self, port, source, count=40, refill=True):
        self.port, self.source, self.count, self.refill = port, source, count, refill
        self.halt = threading.Event()
        self.opened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        held = []
        while not self.halt.is_set():
            held = [s for s in held if not _closed(s)] if self.refill else held
            while len(held) < self.count and self.opened < (self.count if not self.refill else 1 << 30) \
                    and not self.halt.is_set():
                try:
                    held.append(socket.create_connection(("127.0.0.1", self.port), timeout=1,
                                                         source_address=(self.source, 0)))
                    self.opened += 1
                except OSError:
                    break
            time.sleep(0.005)
        for s in held:
            s.close()

    def stop(self):
        self.halt.set()
        self.thread.join(5)


def _closed(sock):
    try:
        if select.select([sock], [], [], 0)[0]:
            data = sock.recv(4096, socket.MSG_DONTWAIT)
            if not data:
                sock.close()
                return True
    except OSError:
        sock.close()
        return True
    return False


def _join_under(flood_source, refill=True):
    """How long the real peer (from 127.0.0.2) takes to join while flood_source floods the coordinator."""
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.2", "127.0.0.3"],
                                     bind="127.0.0.1"), lambda text: None)
    ticker = Ticker(coordinator)
    flood = Flood(coordinator.port, flood_source, refill=refill)
    peer = None
    try:
        assert wait_until(lambda: flood.opened >= 40, timeout=5)
        time.sleep(0.1)  # every waiting place the flood can take is taken
        peer = P.Peer(conf(addr="127.0.0.1", port=coordinator.port, bind="127.0.0.2"), 1, lambda text: None)
        ticker.sides = (coordinator, peer)
        t = time.monotonic()
        joined = poll(lambda: peer.authenticated and 1 in coordinator.peers, timeout=6, every=0.02)
        assert ticker.raised == []
        return time.monotonic() - t if joined else None
    finally:
        flood.stop()
        ticker.stop()
        coordinator.close()
        if peer is not None:
            peer.close()


def test_a_flood_from_another_of_the_runs_hosts_does_not_keep_the_real_peer_out():
    """Finding 3 as reported: an allowed address's connections held all 16 places, the peer never got in."""
    took = _join_under("127.0.0.3")
    assert took is not None and took < 3.0, took


def test_an_idle_flood_from_the_peers_own_address_does_not_keep_it_out_either():
    """Connections that sit idle make way for a newer one from their address: the peer gets in at once,
    not once they expire (HELLO_TIMEOUT). (One that keeps opening connections from the peer's own address
    as fast as they are closed can still crowd it out, since nothing tells the two apart before a proof:
    then the node never joins, which is recorded and, with no controller, a lost host: below.)"""
    took = _join_under("127.0.0.2", refill=False)
    assert took is not None and took < 1.5, took


# -------------------------------------------------------------- finding 7: a MAC on every line


class Proxy:
    """Between a peer and its coordinator, line by line, as someone who can inject into the TCP stream:
    inject(direction, bytes) puts lines between the real ones; `seen` keeps what went each way."""

    def __init__(self, target_port):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(4)
        self.port = self.server.getsockname()[1]
        self.target = target_port
        self.queued = {"to_peer": [], "to_coordinator": []}
        self.seen = {"to_peer": [], "to_coordinator": []}
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def inject(self, direction, data):
        with self.lock:
            self.queued[direction].append(data)

    def _run(self):
        self.server.settimeout(5)
        peer, _ = self.server.accept()
        coordinator = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        ends = {peer: (coordinator, "to_coordinator"), coordinator: (peer, "to_peer")}
        bufs = {peer: b"", coordinator: b""}
        while not self.halt.is_set():
            for sock in select.select(list(ends), [], [], 0.01)[0]:
                data = sock.recv(65536)
                if not data:
                    return
                bufs[sock] += data
                other, direction = ends[sock]
                while b"\n" in bufs[sock]:
                    one, bufs[sock] = bufs[sock].split(b"\n", 1)
                    self.seen[direction].append(one + b"\n")
                    other.sendall(one + b"\n")
            with self.lock:
                for other, direction in ends.values():
                    for data in self.queued[direction]:
                        other.sendall(data)
                    self.queued[direction] = []

    def stop(self):
        self.halt.set()
        self.thread.join(5)
        self.server.close()


def proxied_mesh():
    logs = {"coordinator": [], "peer": []}
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.1"], bind="127.0.0.1"),
                                logs["coordinator"].append)
    proxy = Proxy(coordinator.port)
    peer = P.Peer(conf(addr="127.0.0.1", port=proxy.port), 1, logs["peer"].append)
    ticker = Ticker(coordinator, peer)
    assert wait_until(lambda: peer.authenticated and 1 in coordinator.peers)
    return coordinator, peer, proxy, ticker, logs


def close_mesh(coordinator, peer, proxy, ticker):
    ticker.stop()
    proxy.stop()
    coordinator.close()
    peer.close()


def test_a_forged_or_replayed_stop_in_the_stream_is_dropped_and_logged_and_the_mesh_goes_on():
    coordinator, peer, proxy, ticker, logs = proxied_mesh()
    try:
        proxy.inject("to_peer", b"[" * 9000 + b"\n")  # longer than any line of ours: dropped, not the connection
        assert wait_until(lambda: any("MAC failed" in x for x in logs["peer"]))
        proxy.inject("to_peer", line({"stop": {"reason": "forged"}}))  # no MAC at all
        proxy.inject("to_peer", b"0" * 64 + b" " + line({"stop": {"reason": "forged"}}))  # a wrong one
        proxy.inject("to_coordinator", line({"failed": {"rank": 1, "exit_code": 1, "signal": None}}))
        coordinator.dump("hung: a real request")  # a sealed line, seen by the proxy...
        assert wait_until(lambda: peer.dump_reason == "hung: a real request")
        dump = [x for x in proxy.seen["to_peer"] if b'"dump"' in x][-1]
        peer.dump_reason = None
        proxy.inject("to_peer", dump)  # ...replayed: its counter has passed
        beat = [x for x in proxy.seen["to_coordinator"] if b'"beat"' in x][-1]
        proxy.inject("to_peer", beat)  # the peer's own line reflected back: the wrong direction
        assert wait_until(lambda: sum("MAC failed" in x for x in logs["peer"]) >= 5)
        assert wait_until(lambda: any("MAC failed" in x for x in logs["coordinator"]))
        assert peer.stop_reason is None and peer.dump_reason is None and coordinator.failure is None
        assert peer.authenticated and not coordinator.peers[1].closed  # the connection went on
        coordinator.stop("a real stop")  # and the real words still pass
        assert wait_until(lambda: peer.stop_reason == "a real stop")
        peer.send({"failed": {"rank": 1, "exit_code": 3, "signal": None}})
        assert wait_until(lambda: coordinator.failure == "rank 1 on node 1: exit code 3")
        assert ticker.raised == []
    finally:
        close_mesh(coordinator, peer, proxy, ticker)


injected = st.one_of(
    messages,
    st.binary(min_size=65, max_size=200).map(lambda b: b.replace(b"\n", b" ") + b"\n"),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).map(
        lambda mac: mac.encode() + b" " + line({"stop": {"reason": "forged"}})),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), injected), min_size=1, max_size=6))
def test_random_lines_injected_after_the_handshake_change_nothing(injections):
    coordinator, peer, proxy, ticker, logs = proxied_mesh()
    try:
        for to_peer, data in injections:
            if not data.endswith(b"\n"):
                data += b"\n"  # whole lines: a cut one would only break the line after it (the stream's own)
            proxy.inject("to_peer" if to_peer else "to_coordinator", data)
        time.sleep(0.3)
        assert ticker.raised == []
        assert peer.stop_reason is None and peer.dump_reason is None and coordinator.failure is None
        # whatever happened to the connection, the mesh still carries the real words
        coordinator.stop("real")
        assert wait_until(lambda: peer.stop_reason == "real", timeout=8)
    finally:
        close_mesh(coordinator, peer, proxy, ticker)


# -------------------------------------------------------------- finding 3: never joined, never silent


def start_alone(host_client, tmp_path, join_timeout):
    """Rank 0's host of a two-host run whose other host never comes (its supervisor never connects)."""
    run = "20261201-000000-0033"
    host_client.push(run, project(tmp_path / "p", {"job.py": b"x"}), hold=False)
    spec = {"attempt_key": run, "run_id": run, "node_rank": 0, "node": "n0", "grace": 1.0, "fail_fast": True,
            "time_limit": 40.0, "peers": {"token": TOKEN, "host_lost": 2.0, "join_timeout": join_timeout,
                                          "run": run, "bind": "127.0.0.1", "coordinator": True, "expect": [1],
                                          "allow": ["127.0.0.1"]},
            "ranks": [{"rank": 0, "argv": [sys.executable, "-c", "import time; time.sleep(60)"], "env": {}}]}
    host_client.start(run, spec)
    return tmp_path / "w" / "runs" / run


def test_a_node_that_never_joined_is_recorded_and_with_no_controller_a_lost_host(tmp_path):
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.transport.local import LocalTransport
    from hostkit import make_host

    client = HostClient(make_host(tmp_path / "w"), LocalTransport("w"), Timeouts(command=20))
    try:
        folder = start_alone(client, tmp_path, join_timeout=1.0)
        assert wait_until(lambda: (folder / "rank-0.exit").exists(), timeout=20)
        record = json.loads((folder / "rank-0.exit").read_text())
        assert record["stopped"] and "node 1 lost (never joined" in record["stop_reason"], record
        state = json.loads((folder / "state.json").read_text())
        assert state["mesh"]["never_joined"] == [1] and state["mesh"]["counted_lost"] is True
        assert "never joined this host's coordinator" in (folder / "supervisor.log").read_text()
    finally:
        client.close()


def test_a_node_that_never_joined_while_a_controller_follows_is_recorded_and_the_run_goes_on(tmp_path):
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.remote.host.observe.state import mark_followed
    from clusterrun.transport.local import LocalTransport
    from hostkit import make_host

    client = HostClient(make_host(tmp_path / "w"), LocalTransport("w"), Timeouts(command=20))
    halt = threading.Event()
    run = "20261201-000000-0033"
    folder = tmp_path / "w" / "runs" / run

    def follow():  # what a controller's `follow` of the run does once a second
        while not halt.wait(0.3):
            if folder.exists():
                mark_followed(str(folder))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        start_alone(client, tmp_path, join_timeout=1.0)
        assert wait_until(lambda: "mesh" in json.loads((folder / "state.json").read_text()), timeout=10)
        state = json.loads((folder / "state.json").read_text())
        assert state["mesh"]["never_joined"] == [1] and state["mesh"]["counted_lost"] is False
        time.sleep(1.0)
        assert not (folder / "rank-0.exit").exists()  # the controller keeps its guarantees: no stop
        halt.set()  # the controller goes away: within host_lost the node counts as lost
        assert wait_until(lambda: (folder / "rank-0.exit").exists(), timeout=15)
        assert "never joined" in json.loads((folder / "rank-0.exit").read_text())["stop_reason"]
        assert json.loads((folder / "state.json").read_text())["mesh"]["counted_lost"] is True
    finally:
        halt.set()
        client.stop(run, 1.0)
        client.close()


def test_a_peer_that_never_got_in_stops_when_no_controller_follows(tmp_path):
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import HostClient
    from clusterrun.transport.local import LocalTransport
    from hostkit import make_host

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # takes connections and never says a word: no coordinator there
    client = HostClient(make_host(tmp_path / "w"), LocalTransport("w"), Timeouts(command=20))
    run = "20261201-000000-0034"
    try:
        client.push(run, project(tmp_path / "p", {"job.py": b"x"}), hold=False)
        client.start(run, {"attempt_key": run, "run_id": run, "node_rank": 1, "node": "n1", "grace": 1.0,
                           "fail_fast": True, "time_limit": 40.0,
                           "peers": {"token": TOKEN, "host_lost": 2.0, "join_timeout": 1.0, "run": run,
                                     "bind": "127.0.0.1", "addr": "127.0.0.1", "port": server.getsockname()[1]},
                           "ranks": [{"rank": 1, "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
                                      "env": {}}]})
        folder = tmp_path / "w" / "runs" / run
        assert wait_until(lambda: (folder / "rank-1.exit").exists(), timeout=20)
        record = json.loads((folder / "rank-1.exit").read_text())
        assert record["stopped"] and "never reached rank 0's host's coordinator" in record["stop_reason"]
        assert json.loads((folder / "state.json").read_text())["mesh"]["counted_lost"] is True
        assert "never got into rank 0's host's coordinator" in (folder / "supervisor.log").read_text()
    finally:
        client.close()
        server.close()
