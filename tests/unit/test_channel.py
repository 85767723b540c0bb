"""The kit of the hosts' own channels (remote/host/channel/): bytes read exactly by a deadline, a line
never read past its newline, the handshake's proofs, and the gatekeeper that lets in only a proven hello.
The four protocols built on it are tested in test_peer_mesh.py, test_relay_push.py, test_check_net.py
and test_claims_push.py."""

import socket
import threading
import time

import pytest

from clusterrun.remote.host.channel import gate as G
from clusterrun.remote.host.channel.handshake import JoinError, Joining, Listening, Terms, join
from clusterrun.remote.host.channel.lines import ProtocolError, pack, read_line, recv_exact
from clusterrun.remote.host.wire import read_exact

TOKEN = "t" * 32


class Refused(Exception):
    pass


def test_read_exact_gathers_short_reads_and_names_an_early_end():
    chunks = [b"ab", b"c", b"defg"]
    assert read_exact(lambda k: chunks.pop(0)[:k], 7, lambda: Refused("ended")) == b"abcdefg"
    ends = iter([b"ab", b""])
    with pytest.raises(Refused, match="ended"):
        read_exact(lambda k: next(ends), 3, lambda: Refused("ended"))


def test_recv_exact_keeps_its_deadline_and_says_why_it_gave_up():
    a, b = socket.socketpair()
    try:
        b.sendall(b"12")
        threading.Timer(0.1, lambda: b.sendall(b"345")).start()
        assert recv_exact(a, 5, time.monotonic() + 2, Refused) == b"12345"
        t = time.monotonic()
        with pytest.raises(Refused, match="no answer in the handshake"):
            recv_exact(a, 1, time.monotonic() + 0.3, Refused)
        assert 0.2 < time.monotonic() - t < 1.5  # the deadline, not the socket's default (none)
        b.sendall(b"x")
        b.close()
        with pytest.raises(Refused, match="closed the connection"):
            recv_exact(a, 2, time.monotonic() + 2, Refused)
    finally:
        a.close()


def test_read_line_stops_at_its_newline_and_leaves_the_raw_bytes_after_it():
    a, b = socket.socketpair()
    try:
        b.sendall(pack({"welcome": 1}) + b"\x00raw bytes")
        assert read_line(a, time.monotonic() + 2) == {"welcome": 1}
        assert recv_exact(a, 10, time.monotonic() + 2, Refused) == b"\x00raw bytes"
        b.sendall(b"[" * 200 + b"\n")
        with pytest.raises(ProtocolError, match="not a JSON object of ours"):
            read_line(a, time.monotonic() + 2)
        b.sendall(b"x" * 5000)
        with pytest.raises(ProtocolError, match="longer than"):
            read_line(a, time.monotonic() + 2)
    finally:
        a.close()
        b.close()


def test_a_wrong_proof_is_refused_both_ways_and_a_proof_is_good_for_one_protocol_context_and_node():
    terms = Terms("mesh", TOKEN, "run-1")
    listening, joining = Listening(terms), Joining(terms, 2)
    hello = joining.hello(listening.challenge())
    assert listening.check_hello(hello, {2}) == 2
    joining.check_welcome(listening.welcome(2, hello))  # the right ones pass
    for other in (Terms("mesh", "u" * 32, "run-1"), Terms("wait", TOKEN, "run-1"), Terms("mesh", TOKEN, "run-2")):
        forged = Joining(other, 2)
        with pytest.raises(ProtocolError):
            Listening(terms).check_hello(forged.hello(dict(listening.challenge(), **{"for": "mesh"})), {2})
    with pytest.raises(ProtocolError, match="not a hello"):
        listening.check_hello(dict(hello, hello=3), {2})  # a node nobody expects
    with pytest.raises(ProtocolError, match="did not prove"):
        listening.check_hello(dict(hello, done=True), {2})  # the proof covers done
    with pytest.raises(ProtocolError, match="did not prove"):
        joining.check_welcome({"welcome": 2, "mac": "0" * 64})
    with pytest.raises(ProtocolError, match="not a challenge of clusterrun's mesh"):
        Joining(terms, 2).hello({"challenge": "0" * 32, "for": "relay"})


def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    return server, server.getsockname()[1]


def joining_in_thread(port, token, source=None):
    """A joining end in a thread (the test ticks the gatekeeper): its JoinError's stage, or "joined"."""
    box = {}

    def run():
        s = socket.create_connection(("127.0.0.1", port), timeout=2,
                                     source_address=(source, 0) if source else None)
        try:
            join(s, Terms("mesh", token, "r"), 1, time.monotonic() + 2)
            box["stage"] = "joined"
            box["sock"] = s
        except JoinError as exc:
            box["stage"] = exc.stage
            s.close()

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_the_gatekeeper_lets_in_only_a_proven_hello_from_an_allowed_address():
    server, port = listener()
    logs = []
    keeper = G.Gatekeeper(server, Terms("mesh", TOKEN, "r"), [1], {"127.0.0.2"}, logs.append)
    try:
        stranger = socket.create_connection(("127.0.0.1", port), timeout=2)  # not an allowed address
        wrong_t, wrong = joining_in_thread(port, "u" * 32, "127.0.0.2")
        right_t, right = joining_in_thread(port, TOKEN, "127.0.0.2")
        admitted = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not (admitted and "stage" in wrong):
            admitted += keeper.tick()
            time.sleep(0.01)
        wrong_t.join(3)
        right_t.join(3)
        stranger.settimeout(1)
        assert stranger.recv(100) == b""  # closed before any challenge
        assert wrong["stage"] == "accepted" and right["stage"] == "joined"
        assert [(node, line.peer_ip) for node, line, _ in admitted] == [(1, "127.0.0.2")]
        assert not keeper.pending
        assert any("not one of the expected hosts" in text for text in logs)
        assert any("did not prove" in text for text in logs)
        stranger.close()
        right["sock"].close()
        admitted[0][1].close()
    finally:
        server.close()


def test_a_wrong_proof_at_the_gatekeeper_is_refused_and_logged():
    server, port = listener()
    logs = []
    keeper = G.Gatekeeper(server, Terms("relay", TOKEN, "r"), [1], log=logs.append)
    box = {}

    def wrong():
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        try:
            join(s, Terms("relay", "u" * 32, "r"), 1, time.monotonic() + 2)
        except JoinError as exc:
            box["stage"] = exc.stage
        finally:
            s.close()

    t = threading.Thread(target=wrong)
    t.start()
    assert keeper.admit_one(1.0) is None
    t.join(3)
    assert box == {"stage": "accepted"}
    assert any("did not prove" in r for r in keeper.refusals) and any("did not prove" in text for text in logs)
    server.close()


def test_waiting_places_are_capped_and_a_silent_connection_expires():
    server, port = listener()
    keeper = G.Gatekeeper(server, Terms("mesh", TOKEN, "r"), [1], max_pending=4, timeout=0.3)
    held = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(10)]
    try:
        time.sleep(0.1)
        keeper.tick()
        assert len(keeper.pending) == 4
        time.sleep(0.4)
        keeper.tick()
        assert not keeper.pending and any("no hello within" in r for r in keeper.refusals)
    finally:
        for s in held:
            s.close()
        server.close()


def test_an_empty_or_short_token_is_refused_before_anything_is_proven():
    """Issue 32, finding 9: with an empty token every MAC is one anybody can make."""
    from clusterrun.remote.host import mac
    from clusterrun.remote.host.push import relay
    from clusterrun.remote.host.share import waiter
    from clusterrun.remote.host.wire import Fail

    for short in ("", "x", "s" * (mac.MIN_TOKEN - 1), b""):
        with pytest.raises(mac.ShortToken):
            mac.tag(short, b"data")
        with pytest.raises(mac.ShortToken):
            Terms("mesh", short, "r")
    assert len(mac.tag("s" * mac.MIN_TOKEN, b"data")) == mac.TAG
    server, port = listener()
    with pytest.raises(relay.RelayError, match="at least 16"):
        relay.accept_upstream(server, "short", "r", 1, wait=0.1)
    server.close()
    with pytest.raises(Fail, match="at least 16"):
        waiter.begin("/nonexistent", {}, {"token": ""}, None, None)  # refused before the fork
