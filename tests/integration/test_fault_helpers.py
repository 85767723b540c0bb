"""The fault helpers later tests rely on: each does what it says, and restore() undoes it."""

from __future__ import annotations

import time

import pytest

from support import poll

pytestmark = pytest.mark.integration


def _login(cluster, host, timeout=1.5) -> int:
    return cluster.ssh(host, "true", timeout=timeout)[0]


# A TCP connect to port 22 that says how it ended: connected, timeout, or the errno's name.
PROBE = ("import errno, socket, sys\n"
         "s = socket.socket(); s.settimeout(2)\n"
         "try:\n    s.connect((sys.argv[1], 22)); print('connected')\n"
         "except socket.timeout:\n    print('timeout')\n"
         "except OSError as e:\n    print(errno.errorcode.get(e.errno, e.errno))\n")


def test_partition_cuts_a_host_off_and_heal_brings_it_back_at_its_address(cluster):
    h = cluster.hosts[1]
    peer = cluster.hosts[2]
    cluster.partition(h)
    assert _login(cluster, h) != 0
    rc, out, err = cluster.exec(peer, ["python3", "-c", PROBE, h.address])
    assert rc == 0, err
    assert out.strip() in ("timeout", "EHOSTUNREACH", "ENETUNREACH"), out  # nor from the other hosts
    cluster.heal(h)
    assert _login(cluster, h) == 0
    rc, out, _ = cluster.exec(h, ["ip", "-o", "-4", "addr", "show", "scope", "global"])
    assert f"{h.address}/" in out  # same address, on a renamed interface


def test_crash_kills_everything_and_start_keeps_address_and_host_key(cluster):
    h = cluster.hosts[2]
    rc, out, _ = cluster.exec(h, ["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 & echo $!"])
    assert rc == 0
    known_before = cluster.known_hosts_path.read_text()
    cluster.crash(h)
    assert _login(cluster, h) != 0
    cluster.start(h)  # waits for an SSH login checked against the old known_hosts
    assert cluster.known_hosts_path.read_text() == known_before
    assert [p for p in cluster.processes(h) if p.args.startswith("sleep")] == []


def test_pause_hangs_a_host_and_unpause_resumes_it(cluster):
    h = cluster.hosts[3]
    cluster.pause(h)
    t0 = time.monotonic()
    assert _login(cluster, h) != 0
    assert time.monotonic() - t0 >= 1.0  # no refusal: it hangs until our deadline
    cluster.unpause(h)
    assert _login(cluster, h) == 0


def test_block_drops_one_direction_between_two_hosts_only(cluster):
    a, b, c = cluster.hosts[0], cluster.hosts[1], cluster.hosts[2]
    cluster.block(a, b)
    rc, out, err = cluster.exec(a, ["python3", "-c", PROBE, b.address])
    assert rc == 0 and out.strip() in ("EINVAL", "timeout", "EHOSTUNREACH", "ENETUNREACH"), (rc, out, err)
    assert cluster.exec(a, ["python3", "-c", PROBE, c.address])[1].strip() == "connected"
    assert _login(cluster, a) == 0 and _login(cluster, b) == 0  # the controller still reaches both
    cluster.unblock(a, b)
    assert cluster.exec(a, ["python3", "-c", PROBE, b.address])[1].strip() == "connected"


def test_restore_repairs_every_fault_at_once(cluster):
    h1, h2, h3 = cluster.hosts[1], cluster.hosts[2], cluster.hosts[3]
    cluster.partition(h1)
    cluster.crash(h2)
    cluster.pause(h3)
    assert sorted(cluster.restore()) == [h1.name, h2.name, h3.name]
    assert cluster.healthy()


def test_orphans_lists_what_a_test_leaves_behind_but_not_ssh_sessions(cluster, ssh):
    h = cluster.hosts[1]
    conn = ssh(h)  # an open session: its sshd processes are not orphans
    rc, out, _ = conn.run("setsid sleep 600 >/dev/null 2>&1 < /dev/null & echo $!")
    pid = int(out)
    found = [p for p in cluster.orphans() if p.host == h.name]
    assert [p.pid for p in found] == [pid] and found[0].args == "sleep 600"
    assert any(p.args.startswith("sshd: cr@") for p in cluster.processes(h))
    cluster.kill(h, [pid])
    poll(lambda: cluster.orphans() == [], timeout=3, every=0.1)
    assert cluster.orphans() == []
