"""The integration lane: a real cluster of containers (docker/testcluster) under every SSH test.

The session brings a 4-host cluster up once and always takes it down at the end (failures and Ctrl-C
included). After each test it undoes the test's faults (crash, pause, partition, block) and fails
the test if it left processes of user cr on any host.

Environment:
  CLUSTERRUN_TEST_CLUSTER    cluster name (default crtest): state in .cluster/NAME/
  CLUSTERRUN_TEST_SUBNET     its subnet (default 198.18.201.0/24: beside `testcluster.py up`'s demo)
  CLUSTERRUN_TEST_NET_SUBNETS  the two subnets of the network tests' cluster (`netcluster`: every host
                             with a second interface), "A/25,B/25"; default: CLUSTERRUN_TEST_SUBNET's
                             /24 moved to 198.19 and halved (198.18.201.0/24 → 198.19.201.0/25 and .128/25)
  CLUSTERRUN_KEEP_CLUSTER=1  leave the cluster up after the session; the next session finds it
                             healthy and reuses it as is (seconds saved per run while iterating).
                             A cluster that was already up when the session began is never removed.
  CLUSTERRUN_NO_SKIP=1       (set by .ci/run) fail instead of skipping when docker is unavailable.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_NAME = os.environ.get("CLUSTERRUN_TEST_CLUSTER", "crtest")
CLUSTER_SUBNET = os.environ.get("CLUSTERRUN_TEST_SUBNET", "198.18.201.0/24")
CLUSTER_HOSTS = 4
ORPHAN_GRACE_S = 3.0  # processes that are ending (TERM sent, exit in flight) get this long


import testcluster  # noqa: E402  (docker/ is on pytest's pythonpath: see pyproject.toml)
from clusterkit import CR, SSH  # noqa: E402

_reason_cache: list[str | None] = []


def docker_unavailable_reason() -> str | None:
    if not _reason_cache:
        _reason_cache.append(testcluster.docker_unavailable_reason())
    return _reason_cache[0]


def _required() -> bool:
    return os.environ.get("CLUSTERRUN_NO_SKIP") == "1"  # the root conftest's switch: CI runs every lane


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("integration")]
    if not marked or _required():
        return
    reason = docker_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"integration tests need the docker cluster: {reason}")
        for item in marked:
            item.add_marker(skip)


# --------------------------------------------------------------------------------------------------
# the cluster


def _session_cluster(c):
    """Bring c up for the session (or reuse it, healthy and current), and down at the end unless kept."""
    reason = docker_unavailable_reason()
    if reason:
        if _required():
            pytest.fail(f"CLUSTERRUN_NO_SKIP=1 but the docker cluster cannot run: {reason}", pytrace=False)
        pytest.skip(f"integration tests need the docker cluster: {reason}")
    reused = c.healthy() and c.image_current()
    keep = reused or os.environ.get("CLUSTERRUN_KEEP_CLUSTER", "") not in ("", "0")
    try:
        if reused:
            c.restore(deep=True)  # a previous session may have died in the middle of a fault
        else:
            t0 = time.monotonic()
            c.up(timeout=120)
            print(f"\ncluster {c.name} up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        yield c
    finally:
        if not keep:
            c.down()


def net_subnets() -> tuple[str, str]:
    given = os.environ.get("CLUSTERRUN_TEST_NET_SUBNETS")
    if given:
        first, second = given.split(",")
        return first.strip(), second.strip()
    import ipaddress

    base = ipaddress.ip_network(CLUSTER_SUBNET)
    third = str(base.network_address).split(".")[2]
    return f"198.19.{third}.0/25", f"198.19.{third}.128/25"


@pytest.fixture(scope="session")
def netcluster():
    """A second 4-host cluster for the network tests: every host has a second interface (a second docker
    network, `address2`); up only when a test asks for it, gone at the end of the session."""
    first, second = net_subnets()
    yield from _session_cluster(testcluster.Cluster(f"{CLUSTER_NAME}-net", hosts=CLUSTER_HOSTS, subnet=first,
                                                    second_subnet=second))


@pytest.fixture(scope="session")
def cluster():
    """The session's container cluster: a testcluster.Cluster (hosts, key_path, known_hosts_path,
    inventory_path, exec, ssh, crash/start, pause/unpause, partition/heal, block/unblock, restore,
    processes, orphans)."""
    # A CI runner's timeout sends SIGTERM: make it unwind like Ctrl-C so the teardown runs.
    old_term = signal.getsignal(signal.SIGTERM)
    if old_term is signal.SIG_DFL and threading_is_main():
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield from _session_cluster(testcluster.Cluster(CLUSTER_NAME, hosts=CLUSTER_HOSTS, subnet=CLUSTER_SUBNET))
    finally:
        if old_term is signal.SIG_DFL and threading_is_main():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def threading_is_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(autouse=True)
def _cluster_guard(request):
    """After each integration test: undo its faults, then fail it if it left processes behind."""
    if request.node.get_closest_marker("integration") is None:
        yield
        return
    c = request.getfixturevalue("cluster")
    yield
    c.restore()
    deadline = time.monotonic() + ORPHAN_GRACE_S
    left = c.orphans()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = c.orphans()
    if left:
        # Clean up so that one leak fails one test, not every test after it.
        for host in {p.host for p in left}:
            c.kill(host, [p.pid for p in left if p.host == host])
        pytest.fail("the test left processes of user cr on the cluster:\n"
                    + "\n".join(f"  {p}" for p in left), pytrace=False)


# --------------------------------------------------------------------------------------------------
# fixtures over the support library (clusterkit.py)


@pytest.fixture
def ssh(cluster):
    """Connections as cr over real SSH (strict host keys); what they spawned is killed at the end."""
    s = SSH(cluster)
    yield s
    s.close()


@pytest.fixture
def cr(cluster, tmp_path):
    return CR(cluster, tmp_path, tmp_path / "cr-home")


@pytest.fixture
def small_disk(cluster):
    """node2's workdir on a 4 MB, 200-inode tmpfs; emptied again afterwards."""
    cluster.exec("node2", ["sh", "-c", "rm -rf /small/* /small/.[!.]*"])
    yield lambda hosts: hosts[2].update(workdir="/small/clusterrun")
    cluster.exec("node2", ["sh", "-c", "rm -rf /small/* /small/.[!.]*"])
