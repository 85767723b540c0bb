"""The one fan-out (hosts/group.py): every host in parallel, results and errors by host name in the hosts'
order, every failure kept, a bug still named by its host, connections closed by on_hosts."""

import threading
import time
from dataclasses import dataclass

import pytest

from clusterrun.errors import ConnectError, HostError, HostsFailed, UnexpectedError
from clusterrun.hosts.group import background, fan_out, fan_out_background, on_hosts


@dataclass(frozen=True)
class H:
    name: str


HOSTS = [H("c"), H("a"), H("b"), H("d")]


def test_results_and_errors_are_keyed_by_host_name_in_the_hosts_order():
    def work(h):
        time.sleep({"c": 0.15, "a": 0.0, "b": 0.05, "d": 0.1}[h.name])  # they finish in another order
        if h.name in ("c", "b"):
            raise ConnectError(h.name, "refused")
        return h.name.upper()

    done = fan_out(HOSTS, work, name=lambda h: h.name)
    assert done.results == {"a": "A", "d": "D"}
    assert list(done.failed) == ["c", "b"]  # the order the hosts were given, not the order they failed in
    assert not done.ok
    with pytest.raises(HostsFailed) as info:
        done.raise_for("connect")
    assert list(info.value.failures) == ["c", "b"] and "connect failed on 2 hosts" in str(info.value)


def test_every_host_runs_at_once():
    started, gate = [], threading.Barrier(len(HOSTS), timeout=5)

    def work(h):
        started.append(h.name)
        gate.wait()  # only passes when all four run at the same time
        return True

    assert fan_out(HOSTS, work, name=lambda h: h.name).ok
    assert sorted(started) == ["a", "b", "c", "d"]


def test_a_hundred_hosts_all_wait_for_each_other():
    """Phases where every host waits for all the others (the claims' barrier, the relay chain): a pool of
    fewer threads than hosts (it was 64) leaves the last ones unstarted and the barrier broken."""
    hosts = [H(f"n{i}") for i in range(100)]
    gate = threading.Barrier(len(hosts), timeout=10)
    done = fan_out(hosts, lambda h: gate.wait() >= 0, name=lambda h: h.name)
    assert done.ok and len(done.results) == 100


def test_the_threads_are_daemons():
    """A poll that gives up abandons the calls still running: they must not keep the controller alive."""
    seen = []
    fan_out(HOSTS, lambda h: seen.append(threading.current_thread()), name=lambda h: h.name)
    assert all(t.daemon for t in seen) and len(seen) == 4


def test_a_bug_in_one_call_is_that_hosts_error_and_the_others_go_on():
    def work(h):
        if h.name == "a":
            raise KeyError("boom")
        return 1

    done = fan_out(HOSTS, work, name=lambda h: h.name)
    assert isinstance(done.errors["a"], UnexpectedError) and "KeyError" in str(done.errors["a"])
    assert done.errors["a"].host == "a" and set(done.results) == {"b", "c", "d"}


def test_names_must_be_unique():
    with pytest.raises(ValueError, match="unique"):
        fan_out([H("a"), H("a")], lambda h: 1, name=lambda h: h.name)


def test_poll_runs_while_waiting_and_may_give_up():
    polls = []

    def poll():
        polls.append(time.monotonic())
        if len(polls) >= 3:
            raise TimeoutError("gave up")

    with pytest.raises(TimeoutError):
        fan_out(HOSTS, lambda h: time.sleep(2), name=lambda h: h.name, poll=poll)
    assert len(polls) == 3


def test_fan_out_background_reports_each_host_as_it_ends():
    seen, lock, done = [], threading.Lock(), threading.Event()

    def each(h, result):
        with lock:
            seen.append((h.name, result if not isinstance(result, HostError) else "error"))
            if len(seen) == len(HOSTS):
                done.set()

    fan_out_background(HOSTS, lambda h: h.name * 2 if h.name != "d" else 1 / 0, name=lambda h: h.name, on_each=each)
    assert done.wait(5)
    assert sorted(seen) == [("a", "aa"), ("b", "bb"), ("c", "cc"), ("d", "error")]


class FakeClient:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def close(self):
        self.log.append(("close", self.name))


def test_on_hosts_connects_runs_and_closes_every_connection():
    log = []

    @dataclass(frozen=True)
    class Node:
        host: H
        rank: int

    def connect(host):
        if host.name == "b":
            raise ConnectError("b", "no route")
        log.append(("connect", host.name))
        return FakeClient(host.name, log)

    def fn(node, client):
        if node.host.name == "c":
            raise HostError("c", "command failed")
        return (node.rank, client.name)

    nodes = [Node(h, i) for i, h in enumerate(HOSTS)]
    done = on_hosts(nodes, connect, fn)
    assert done.results == {"a": (1, "a"), "d": (3, "d")}
    assert list(done.failed) == ["c", "b"]
    assert sorted(e for e in log if e[0] == "close") == [("close", "a"), ("close", "c"), ("close", "d")]


def test_on_hosts_takes_hosts_themselves():
    done = on_hosts(HOSTS, lambda h: FakeClient(h.name, []), lambda h, client: client.name, host=lambda h: h)
    assert done.results == {"a": "a", "b": "b", "c": "c", "d": "d"}


def test_background_runs_beside_the_caller_and_hands_back_its_result_or_error():
    assert background(lambda x, y: x + y, 2, 3).result(5) == 5
    failing = background(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(5)
