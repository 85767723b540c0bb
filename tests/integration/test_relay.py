"""Relay push over real SSH (hosts/relay.py, remote/host/push/relay.py): the controller sends each object once,
to the chain's first host, the hosts pass it on over direct TCP; every failure on that path ends in a
direct push or a clean failure that names the host."""

import hashlib
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from clusterkit import JOBS
from support import wait_for, write_tree

pytestmark = pytest.mark.integration


def project(tmp_path: Path, data_mb: int = 3) -> Path:
    sub = {f"data/sub/f{i}.txt": os.urandom(100 + i) for i in range(40)}
    root = write_tree(tmp_path / "project", {
        "worker.py": (JOBS / "worker.py").read_bytes() + b"# %s\n" % os.urandom(8).hex().encode(),
        "data/blob.bin": os.urandom(data_mb << 20), **sub,
        "data/twin.txt": sub["data/sub/f0.txt"],  # same object twice
        "data/tool.sh": "#!/bin/sh\necho %s\n" % os.urandom(8).hex()})  # all content new to every host
    (root / "data" / "tool.sh").chmod(0o755)
    return root


def local_tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), os.access(p, os.X_OK))
            for p in sorted(root.rglob("*")) if p.is_file()}


def host_tree(cluster, host: str, run_id: str) -> dict:
    script = ("cd ~/.clusterrun/runs/%s/job && find . -type f | sort | while read -r f; do "
              "x=0; [ -x \"$f\" ] && x=1; printf '%%s %%s %%s\\n' \"$(sha256sum < \"$f\" | cut -c1-64)\" $x \"$f\"; "
              "done" % run_id)
    rc, out, err = cluster.exec(host, ["sh", "-c", script])
    assert rc == 0, err
    tree = {}
    for line in out.splitlines():
        sha, x, path = line.split(" ", 2)
        tree[path[2:]] = (sha, x == "1")
    return tree


def relay_inventory(cr, root: Path, relay="true", **top):
    return cr.inventory(job={"root": str(root), "args": ["--no-dist", "--steps", "1"], "sync": ["data/"]},
                        top={"push": {"relay": relay}, **top})


def test_a_relay_push_sends_every_byte_once_and_every_host_gets_the_same_tree(cr, cluster, tmp_path):
    root = project(tmp_path)
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) - (root / "data" / "twin.txt").stat().st_size
    done = cr.run("launch", inv := relay_inventory(cr, root))
    assert done.returncode == 0, done.stderr
    assert "relay push" not in done.stderr  # no fallback warning on a healthy cluster
    (run,) = cr.ps()
    hosts = run["hosts"]
    assert hosts[0]["pushed_bytes"] == total and hosts[0]["relayed_bytes"] == 0  # the controller: once, to node0
    assert [h["pushed_bytes"] for h in hosts[1:]] == [0, 0, 0]
    assert [h["relayed_bytes"] for h in hosts[1:]] == [total] * 3  # the rest came from the host before
    expected = local_tree(root)
    for host in ("node0", "node1", "node2", "node3"):
        assert host_tree(cluster, host, run["id"]) == expected, host

    again = cr.run("launch", inv)  # unchanged: nothing moves, from the controller or between hosts
    assert again.returncode == 0, again.stderr
    newest = cr.ps()[0]
    assert [(h["pushed_bytes"], h["relayed_bytes"]) for h in newest["hosts"]] == [(0, 0)] * 4

    (root / "data" / "sub" / "f3.txt").write_bytes(os.urandom(7))  # one new object: to node0, then along the chain
    third = cr.run("launch", inv)
    assert third.returncode == 0, third.stderr
    newest = cr.ps()[0]
    assert [(h["pushed_bytes"], h["relayed_bytes"]) for h in newest["hosts"]] == [(7, 0)] + [(0, 7)] * 3
    assert host_tree(cluster, "node3", newest["id"]) == local_tree(root)


def test_a_host_its_upstream_cannot_reach_falls_back_to_a_direct_push(cr, cluster, tmp_path):
    root = project(tmp_path)
    cluster.block("node0", "node1")  # node0 cannot open the relay connection to node1
    done = cr.run("launch", relay_inventory(cr, root))
    assert done.returncode == 0, done.stderr
    assert re.search(r"node0: relay push: next host node1: .+; the rest came directly", done.stderr), done.stderr
    assert re.search(r"node1: relay push: from the upstream host: .+; the rest came directly", done.stderr)
    (run,) = cr.ps()
    total = run["hosts"][0]["pushed_bytes"]
    assert total > 3 << 20
    assert run["hosts"][1]["pushed_bytes"] == total  # node1's objects came directly from the controller
    expected = local_tree(root)
    for host in ("node0", "node1", "node2", "node3"):
        assert host_tree(cluster, host, run["id"]) == expected, host
    # the block also cut node0's supervisor off node1's (their end-of-run handshake): it ends on its own
    cluster.unblock("node0")
    wait_for(lambda: not cluster.orphans(["node0"]), timeout=30, what="node0's supervisor ended")


def _bridge_of(address: str) -> str:
    out = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=True).stdout
    return re.search(r"\bdev (\S+)", out).group(1)


def test_a_relay_host_killed_mid_push_fails_the_launch_naming_it_and_leaves_nothing(cr, cluster, tmp_path):
    root = project(tmp_path, data_mb=24)
    bridge = _bridge_of(cluster.host("node0").address)
    # the controller's link at 40 Mbit/s: the push takes seconds, hosts still talk to each other at full speed
    subprocess.run(["tc", "qdisc", "replace", "dev", bridge, "root", "tbf", "rate", "40mbit", "burst", "64kb",
                    "latency", "100ms"], check=True)
    try:
        proc = cr.popen("launch", relay_inventory(cr, root))

        def receiving(host):
            rc, out, _ = cluster.exec(host, ["sh", "-c", "ls ~/.clusterrun/cache/objects/*/ 2>/dev/null | "
                                                         "grep -c tmp- || true"])
            return out.strip() not in ("", "0")

        wait_for(lambda: receiving("node1"), timeout=60, what="node1 receiving from node0")
        cluster.crash("node1")
        out, err = proc.communicate(timeout=120)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", bridge, "root"], check=False)
    assert proc.returncode in (1, 3), err
    assert re.search(r"node1: .*(connection lost|unreachable|no answer|push)", err), err
    assert "nothing was started" in err
    (run,) = cr.ps()
    assert {r["state"] for r in run["ranks"]} == {"not-started"}
    cluster.start("node1")
    for host in ("node0", "node2", "node3"):  # what the others received is removed again
        wait_for(lambda host=host: run["id"] not in cr.run_dirs(host), timeout=30, what=f"{host}'s run folder removed")


def test_auto_relays_only_when_it_pays(cr, cluster, tmp_path):
    root = project(tmp_path, data_mb=1)  # well under the threshold: direct pushes, as before
    done = cr.run("launch", relay_inventory(cr, root, relay="auto"))
    assert done.returncode == 0, done.stderr
    (run,) = cr.ps()
    assert all(h["relayed_bytes"] == 0 and h["pushed_bytes"] > 1 << 20 for h in run["hosts"])


HOST_PROGRAM = Path(__file__).resolve().parents[2] / "clusterrun" / "remote" / "host"
SHIPPED = ("__init__.py", "mac.py", "wire.py", "stdlib.py", "channel/__init__.py", "channel/gate.py", "channel/handshake.py",
           "channel/lines.py", "net/__init__.py", "push/__init__.py", "push/relay.py")  # what relay.py needs
LISTEN = ("import socket, sys; sys.path.insert(0, '/tmp'); from crhost.push import relay as crrelay; "
          "s = socket.socket(); s.bind(('', 0)); s.listen(4); "
          "print(s.getsockname()[1], flush=True); c = crrelay.accept_upstream(s, 'the-token-of-this-push', 'run-1', 1, 20); "
          "print('accepted', c.recv(5).decode(), flush=True)")
KNOCK = ("import sys; sys.path.insert(0, '/tmp'); from crhost.push import relay as crrelay\n"
         "try:\n    c = crrelay.connect_downstream(sys.argv[1], int(sys.argv[2]), sys.argv[3], 'run-1', 1, 5)\n"
         "except crrelay.RelayError as e:\n    print('refused:', e)\nelse:\n    c.sendall(b'hello'); print('in')\n")


def test_a_wrong_token_is_refused_and_the_real_upstream_still_gets_in(cluster, ssh):
    """The host program's relay handshake between real hosts: node1 listens for its upstream; node0 knocks
    with the wrong token (refused on both ends, nothing read), then node2 with the right one."""
    for host in ("node0", "node1", "node2"):
        for rel in SHIPPED:
            rc, _, err = cluster.exec(host, ["sh", "-c", f"mkdir -p /tmp/crhost/{Path(rel).parent} && "
                                                         f"cat > /tmp/crhost/{rel}"],
                                      input=(HOST_PROGRAM / rel).read_text())
            assert rc == 0, err
    listener = ssh("node1").spawn(f"/opt/venv/bin/python -c {shlex.quote(LISTEN)}")
    port = listener.readline(timeout=20).strip()
    assert port.isdigit(), port
    addr = cluster.host("node1").address
    rc, out, err = cluster.exec("node0", ["/opt/venv/bin/python", "-c", KNOCK, addr, port, "a-wrong-token-of-this-push"])
    assert out.startswith(f"refused: {addr}:{port} did not accept the push's token"), out + err
    rc, out, err = cluster.exec("node2", ["/opt/venv/bin/python", "-c", KNOCK, addr, port, "the-token-of-this-push"])
    assert out.strip() == "in", out + err
    assert listener.readline(timeout=20).strip() == "accepted hello"
    assert listener.wait(timeout=20)[0] == 0
    for host in ("node0", "node1", "node2"):
        cluster.exec(host, ["rm", "-rf", "/tmp/crhost"])
