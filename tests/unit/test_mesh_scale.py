"""The peer mesh when many hosts join at once on a loaded machine (issue 37, item 2: at 64 hosts runs were
stopped as "nodeK lost (its supervisor closed the connection)"): a peer whose loop ran late reads the
welcome already waiting before it judges the coordinator slow, and a joined peer that dropped its
connection and came straight back is not a lost host."""

import time

from clusterrun.remote.host.run import peers as P

TOKEN = "b" * 32


def conf(**extra):
    return {"token": TOKEN, "host_lost": 30.0, "join_timeout": 30.0, "run": "20261201-000000-0002",
            "bind": "127.0.0.1", **extra}


def mesh():
    logs = []
    coordinator = P.Coordinator(conf(coordinator=True, expect=[1], allow=["127.0.0.1"]), logs.append)
    peer = P.Peer(conf(addr="127.0.0.1", port=coordinator.port), 1, logs.append)
    return coordinator, peer, logs


def tick_until(predicate, *sides, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for side in sides:
            side.tick(time.time())
            if predicate():
                return True
        time.sleep(0.01)
    return False


def test_a_welcome_that_waited_while_the_peers_loop_was_late_lets_it_in():
    coordinator, peer, logs = mesh()
    try:
        # up to the coordinator's welcome, which the peer has not read yet
        assert tick_until(lambda: 1 in coordinator.peers, coordinator, peer)
        assert not peer.authenticated
        time.sleep(0.05)
        peer.tick(time.time() + P.HELLO_TIMEOUT + 1.0)  # its next tick comes late (a loaded host)
        assert peer.authenticated, logs
        coordinator.tick(time.time())
        assert coordinator.failure is None and not coordinator.lost
    finally:
        coordinator.close()
        peer.close()


def test_a_joined_peer_that_reconnects_at_once_is_not_lost():
    coordinator, peer, logs = mesh()
    try:
        assert tick_until(lambda: peer.authenticated and 1 in coordinator.peers, coordinator, peer)
        first = coordinator.peers[1]
        peer._drop()  # as when it gave up on a welcome that came late
        assert tick_until(lambda: first.closed, coordinator, timeout=2)
        assert tick_until(lambda: peer.authenticated and coordinator.peers[1] is not first, coordinator, peer)
        assert coordinator.failure is None and not coordinator.lost, logs
    finally:
        coordinator.close()
        peer.close()


def test_a_joined_peer_whose_connection_closed_for_good_is_lost_after_the_rejoin_grace():
    coordinator, peer, logs = mesh()
    try:
        assert tick_until(lambda: peer.authenticated and 1 in coordinator.peers, coordinator, peer)
        peer.close()
        t = time.time()
        assert tick_until(lambda: coordinator.peers[1].closed, coordinator, timeout=2)
        coordinator.tick(t)
        assert not coordinator.lost  # within the grace
        coordinator.tick(t + P.REJOIN_S + 0.5)
        assert coordinator.lost == {1} and "closed the connection" in coordinator.failure
    finally:
        coordinator.close()
