"""The container cluster itself: logins, the master port between hosts, gloo across 4 hosts."""

from __future__ import annotations

import concurrent.futures
import shlex
import subprocess
import uuid

import paramiko
import pytest

pytestmark = pytest.mark.integration

PY = "/opt/venv/bin/python"


def test_every_host_accepts_the_generated_key_with_strict_host_keys(cluster, ssh):
    for h in cluster.hosts:
        conn = ssh(h)  # RejectPolicy + the generated known_hosts: a wrong host key fails here
        rc, out, err = conn.run(
            f"hostname; id -un; id -u; {PY} -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'")
        assert rc == 0, err
        # gloo finds its own address by resolving the hostname: it must be the cluster address.
        assert out.split() == [h.name, "cr", "1000", h.address]


def test_the_cluster_files_match_the_inventory(cluster):
    import yaml

    inv = yaml.safe_load(cluster.inventory_path.read_text())
    assert inv["version"] == 1
    assert inv["defaults"]["identity_file"] == str(cluster.key_path)
    assert inv["defaults"]["known_hosts"] == str(cluster.known_hosts_path)
    assert inv["defaults"]["host_key_policy"] == "strict"
    assert inv["hosts"] == [{"name": h.name, "host": h.address} for h in cluster.hosts]
    known = {line.split()[0] for line in cluster.known_hosts_path.read_text().splitlines()}
    assert known == {h.address for h in cluster.hosts}
    assert cluster.key_path.stat().st_mode & 0o077 == 0


def test_host_keys_are_checked_and_login_is_key_only(cluster, ssh, tmp_path):
    h0, h1 = cluster.hosts[0], cluster.hosts[1]
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        ssh.client(h0, known_hosts=empty)
    # node1's key listed for node0's address: a changed host key.
    key1 = next(line.split(None, 1)[1] for line in cluster.known_hosts_path.read_text().splitlines()
                if line.startswith(h1.address + " "))
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"{h0.address} {key1}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        ssh.client(h0, known_hosts=wrong)
    # A key the hosts do not know, and root with the right key: both refused.
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with pytest.raises(paramiko.AuthenticationException):
        ssh.client(h0, key_filename=other)
    with pytest.raises(paramiko.AuthenticationException):
        ssh.client(h0, username="root")
    # No password authentication is offered at all.
    client = paramiko.SSHClient()
    client.load_host_keys(str(cluster.known_hosts_path))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        with pytest.raises(paramiko.AuthenticationException):
            client.connect(h0.address, username="cr", password="cr", look_for_keys=False,
                           allow_agent=False, timeout=10)
    finally:
        client.close()


LISTENER = r"""
import socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port))
srv.listen(64)
srv.settimeout(30)
print("ready", flush=True)
seen = []
for _ in range(n):
    conn, (addr, _) = srv.accept()
    conn.settimeout(10)
    name = conn.recv(64).decode()
    conn.sendall(b"ok")
    conn.recv(1)  # wait for the client to close first: the TIME_WAIT stays on its side
    conn.close()
    seen.append(f"{name}@{addr}")
print(" ".join(sorted(seen)), flush=True)
"""

CLIENT = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(socket.gethostname().encode())
assert s.recv(2) == b"ok"
s.close()
print("connected")
"""


def test_rank0_host_accepts_the_master_port_from_every_other_host(cluster, ssh):
    master, others = cluster.hosts[0], cluster.hosts[1:]
    port = 29500  # the inventory's master port
    listener = ssh(master).spawn(shlex.join([PY, "-c", LISTENER, str(len(others)), str(port)]))
    assert listener.readline(timeout=30).strip() == "ready"

    def dial(h):
        return ssh(h).run([PY, "-c", CLIENT, master.address, str(port)], timeout=30)

    with concurrent.futures.ThreadPoolExecutor(len(others)) as pool:
        results = list(pool.map(dial, others))
    for h, (rc, out, err) in zip(others, results):
        assert (rc, out.strip()) == (0, "connected"), f"{h.name}: {err}"
    rc, out = listener.wait(timeout=30)
    assert rc == 0, out
    # Each peer is seen at its own address: no NAT or proxy between the hosts.
    assert out.split()[-len(others):] == sorted(f"{h.name}@{h.address}" for h in others)


ALL_REDUCE = r"""
import datetime, os, socket
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank={rank} world={dist.get_world_size()} host={socket.gethostname()} sum={t.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_gloo_all_reduce_across_4_hosts_started_by_hand(cluster, ssh):
    hosts = cluster.hosts[:4]
    master = hosts[0]
    port = 29500

    def command(rank: int) -> str:
        env = {"MASTER_ADDR": master.address, "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(len(hosts)), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), PY, "-c", ALL_REDUCE])

    ranks = [ssh(h).spawn(command(r)) for r, h in enumerate(hosts)]  # rank 0 first
    results = [p.wait(timeout=180) for p in ranks]
    for r, (h, (rc, out)) in enumerate(zip(hosts, results)):
        assert rc == 0, f"rank {r} on {h.name} exited {rc}:\n{out}"
        assert f"rank={r} world=4 host={h.name} sum=10" in out, out


def test_shared_dir_is_common_to_all_hosts_and_writable(cluster, ssh):
    name = f"probe-{uuid.uuid4().hex[:8]}"
    first, last = cluster.hosts[0], cluster.hosts[-1]
    assert ssh(first).run(f"echo from-{first.name} > /shared/{name}")[0] == 0
    rc, out, err = ssh(last).run(f"cat /shared/{name} && rm /shared/{name}")
    assert (rc, out.strip()) == (0, f"from-{first.name}"), err
    assert not (cluster.shared_dir / name).exists()
