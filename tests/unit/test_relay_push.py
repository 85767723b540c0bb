"""Relay push through the local transport: three "hosts" (workdirs) on this machine, the chain over
loopback. The controller sends each object once; hosts pass on the rest; failures fall back to direct."""

import hashlib
import os
import socket
import threading
import time

import pytest

from clusterrun.config.inventory import Timeouts
from clusterrun.hosts.client import HostClient
from clusterrun.hosts.relay import RelayGroup, relay_wanted
from clusterrun.hosts.relay import for_push as relay_for_push
from clusterrun.remote.host import net as host_net
from clusterrun.remote.host.push import relay as host_relay
from clusterrun.transport.local import LocalTransport
from hostkit import make_host, project

RUN = "20261201-000000-0001"


def clients(tmp_path, n=3):
    return [HostClient(make_host(tmp_path / f"w{i}"), LocalTransport(f"h{i}"), Timeouts(command=20))
            for i in range(n)]


def push_all(cs, manifest, group, run_id=RUN):
    out, errors = {}, {}

    def one(i):
        try:
            out[i] = cs[i].push(run_id, manifest, relay=(group, i), hold=False).result
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            errors[i] = exc
            group.fail(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, errors


def tree(root):
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


@pytest.fixture
def job(tmp_path):
    return project(tmp_path, {"job.py": b"print(1)\n", "data/a.bin": os.urandom(3 << 20),
                              "data/b.bin": os.urandom(200_000), "data/c.txt": b"c" * 10})


def test_each_object_leaves_the_controller_once_and_every_tree_is_identical(tmp_path, job):
    cs = clients(tmp_path)
    group = RelayGroup(3, order=job.object_order())
    out, errors = push_all(cs, job, group)
    assert not errors, errors
    total = job.total_bytes
    assert [out[i].sent_bytes for i in range(3)] == [total, 0, 0]
    assert [out[i].relayed for i in range(3)] == [0, total, total]
    trees = [tree(tmp_path / f"w{i}" / "runs" / RUN / "job") for i in range(3)]
    assert trees[0] == trees[1] == trees[2] and len(trees[0]) == 4
    # the next push of the same job sends nothing and relays nothing
    again, _ = push_all(cs, job, RelayGroup(3), run_id="20261201-000000-0002")
    assert [(again[i].sent_bytes, again[i].relayed) for i in range(3)] == [(0, 0)] * 3


def test_a_host_that_already_has_objects_still_passes_them_on(tmp_path, job):
    cs = clients(tmp_path)
    cs[1].push("20261201-000000-0009", job, hold=False)  # the middle host has everything already
    out, errors = push_all(cs, job, RelayGroup(3))
    assert not errors, errors
    assert out[1].relayed == job.total_bytes and out[2].relayed == job.total_bytes  # passed through host 1
    assert tree(tmp_path / "w2" / "runs" / RUN / "job") == tree(tmp_path / "w0" / "runs" / RUN / "job")


def test_an_unreachable_next_host_falls_back_to_a_direct_push(tmp_path, job, monkeypatch):
    cs = clients(tmp_path)
    group = RelayGroup(3, connect_wait=1.0)
    real = RelayGroup._instructions

    def wrong_port(self, chain, j):  # host 0 is told a port where nobody listens
        out = real(self, chain, j)
        if out["downstream"] and j == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                out["downstream"]["port"] = s.getsockname()[1]
        return out

    monkeypatch.setattr(RelayGroup, "_instructions", wrong_port)
    out, errors = push_all(cs, job, group)
    assert not errors, errors
    assert out[0].relay_notes and "cannot reach" in out[0].relay_notes[0]
    assert out[1].sent_bytes == job.total_bytes and out[1].relayed == 0  # it waited, then got it directly
    # host 1 closed its own downstream at once, so host 2 did not wait either: direct as well
    assert out[2].sent_bytes == job.total_bytes and "closed the connection" in out[2].relay_notes[0]
    assert tree(tmp_path / "w1" / "runs" / RUN / "job") == tree(tmp_path / "w0" / "runs" / RUN / "job") == \
        tree(tmp_path / "w2" / "runs" / RUN / "job")


def test_a_wrong_token_is_refused_before_any_byte():
    server = host_net.bind_address("127.0.0.1")
    port = server.getsockname()[1]
    result = {}

    def accept():
        try:
            host_relay.accept_upstream(server, "right" * 8, RUN, 1, wait=1.5)
        except host_relay.RelayError as exc:
            result["accept"] = str(exc)

    t = threading.Thread(target=accept)
    t.start()
    with pytest.raises(host_relay.RelayError, match="did not accept the push.s token"):
        host_relay.connect_downstream("127.0.0.1", port, "wrong" * 8, RUN, 1, wait=2)
    t.join(5)
    assert "did not connect" in result["accept"] or "refused" in result["accept"]
    server.close()


def test_a_silent_connection_and_a_stranger_cost_the_real_upstream_nothing():
    """Issue 21: the relay listener handshook one connection at a time for 10 s, so one silent connection
    made the chain fall back to direct pushes. Now several handshakes run at once, each briefly, and only
    the upstream host's address gets in."""
    server = host_net.bind_address("127.0.0.1")
    port = server.getsockname()[1]
    result = {}

    def accept():
        try:
            conn = host_relay.accept_upstream(server, "right" * 8, RUN, 1, wait=8, upstream="127.0.0.3")
            result["peer"] = conn.getpeername()[0]
            conn.close()
        except host_relay.RelayError as exc:
            result["error"] = str(exc)

    t = threading.Thread(target=accept)
    t.start()
    silent = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0))  # says nothing
    stranger = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.4", 0))
    stranger.settimeout(2)
    assert stranger.recv(100) == b""  # closed at once: not the upstream host
    t0 = time.monotonic()
    conn = host_relay.connect_downstream("127.0.0.1", port, "right" * 8, RUN, 1, wait=5, source="127.0.0.3")
    assert time.monotonic() - t0 < 2  # not held up by the silent one
    conn.close()
    t.join(10)
    assert result == {"peer": "127.0.0.3"}
    silent.close()
    stranger.close()
    server.close()


def test_relay_is_chosen_when_it_pays():
    assert not relay_wanted("auto", 2, 1 << 30) and not relay_wanted("auto", 8, 1 << 20)
    assert relay_wanted("auto", 8, 64 << 20) and relay_wanted("true", 2, 10) and not relay_wanted("false", 16, 1 << 30)


def test_a_job_too_small_to_pay_skips_the_chain_for_every_host():
    class Manifest:
        def __init__(self, size):
            self.total_bytes = size

        def object_order(self):
            return {"a" * 64: 0}

    t = Timeouts()
    small = relay_for_push("auto", 4, t)
    assert small is not None and not small.pays(Manifest(1 << 20))  # 4 x 1 MiB < 16 MiB: no barrier, no chain
    big = relay_for_push("auto", 4, t)
    assert big.pays(Manifest(5 << 20)) and big.order == {"a" * 64: 0}
    assert relay_for_push("true", 2, t).pays(Manifest(10))  # true: always, however small
    assert relay_for_push("false", 16, t) is None
