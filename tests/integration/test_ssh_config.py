"""~/.ssh/config aliases and ProxyJump (fabric's gateway: a direct-tcpip channel through the jump host)."""

import json
import subprocess
import time

import pytest

from faultkit import FAST

pytestmark = pytest.mark.integration


@pytest.fixture
def home_with_ssh_config(cr, cluster, tmp_path):
    """A HOME whose ~/.ssh/config names the hosts by alias; node1 only through node0 (ProxyJump)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    n0, n1 = cluster.host("node0").address, cluster.host("node1").address
    (home / ".ssh" / "config").write_text(f"""\
Host gate
    HostName {n0}
    User cr
    IdentityFile {cluster.key_path}
Host inner
    HostName {n1}
    User cr
    IdentityFile {cluster.key_path}
    ProxyJump gate
""")
    cr.env["HOME"] = str(home)
    return n0, n1


@pytest.fixture
def no_direct_route_to(cluster):
    """Refuse this machine's own SSH connections to a host, so only a jump can reach it."""
    rules = []

    def block(address):
        rule = ["OUTPUT", "-d", address, "-p", "tcp", "--dport", "22", "-j", "REJECT"]
        subprocess.run(["iptables", "-I", *rule], check=True)
        rules.append(rule)

    yield block
    for rule in rules:
        subprocess.run(["iptables", "-D", *rule], check=True)


def test_aliases_and_proxy_jump_from_ssh_config(cr, cluster, home_with_ssh_config, no_direct_route_to):
    n0, n1 = home_with_ssh_config
    no_direct_route_to(n1)
    direct = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-i", str(cluster.key_path),
                             "-o", f"UserKnownHostsFile={cluster.known_hosts_path}", f"cr@{n1}", "true"],
                            capture_output=True)
    assert direct.returncode != 0  # really no direct way to node1 from here

    def aliases(hosts):
        hosts[:] = [{"name": "gate", "host": "gate"}, {"name": "inner", "host": "inner"}]

    inv = cr.inventory(job={"args": ["--steps", "2"]}, top={"timeouts": FAST}, edit_hosts=aliases)
    text = inv.read_text().replace("  user: cr\n", "").replace(f"  identity_file: {cluster.key_path}\n", "")
    inv.write_text(text)  # user and key come from ~/.ssh/config now
    dry = cr.run("launch", "--dry-run", inv)
    assert dry.returncode == 0, dry.stderr
    assert f"MASTER_ADDR={n0}" in dry.stdout  # the alias resolved: other hosts can reach that
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    assert "[inner r1] rank 1 finished" in done.stdout


def test_a_jump_host_that_cannot_be_reached_is_named(cr, cluster, home_with_ssh_config, no_direct_route_to):
    n0, n1 = home_with_ssh_config
    no_direct_route_to(n0)
    inv = cr.inventory(job={"args": ["--steps", "1"]}, top={"timeouts": FAST},
                       edit_hosts=lambda hosts: hosts.__setitem__(slice(None), [{"name": "inner", "host": "inner"}]))
    done = cr.run("launch", inv)
    assert done.returncode == 3, done.stderr
    assert "inner: unreachable" in done.stderr and n0 in done.stderr


def test_alias_match_and_proxyjump_from_included_files(cr, cluster, tmp_path, no_direct_route_to):
    """The layout people have: ~/.ssh/config says `Include config.d/*`; an alias, a Match block and a
    ProxyJump live only in the included file (paramiko's parser ignores Include and Match)."""
    n = {h.name: h.address for h in cluster.hosts}
    home = tmp_path / "home"
    (home / ".ssh" / "config.d").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Include config.d/*\n")
    key = cluster.key_path
    (home / ".ssh" / "config.d" / "lab.conf").write_text(f"""\
Host labnode*
    User cr
    IdentityFile {key}
Host labnode1
    HostName {n['node1']}
Host labnode3
    HostName {n['node3']}
    ProxyJump labgate
Host labgate
    HostName {n['node0']}
    User cr
    IdentityFile {key}
Match originalhost labnode2
    HostName {n['node2']}
""")
    cr.env["HOME"] = str(home)
    no_direct_route_to(n["node3"])

    def aliases(hosts):
        hosts[:] = [{"name": f"lab{i}", "host": f"labnode{i}"} for i in (1, 2, 3)]

    inv = cr.inventory(job={"args": ["--steps", "2"]}, top={"timeouts": FAST}, edit_hosts=aliases)
    text = inv.read_text().replace("  user: cr\n", "").replace(f"  identity_file: {key}\n", "")
    inv.write_text(text)
    dry = cr.run("launch", "--dry-run", inv)
    assert dry.returncode == 0, dry.stderr
    assert f"MASTER_ADDR={n['node1']}" in dry.stdout
    lab_conf = str(home / ".ssh" / "config.d" / "lab.conf")
    assert f"# lab2: hostname {n['node2']} (ssh config {lab_conf}:14)" in dry.stdout
    assert f"user cr (ssh config {lab_conf}:2)" in dry.stdout
    assert f"proxyjump cr@{n['node0']}:22 (ssh config {lab_conf}:8)" in dry.stdout
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    assert "[lab3 r2] rank 2 finished" in done.stdout


def test_what_only_openssh_evaluates_goes_through_ssh_G(cr, cluster, tmp_path):
    """A `Match exec` block decides the address: only `ssh -G` can say (CLUSTERRUN_SSH_CONFIG names the
    file, as `ssh -F` would)."""
    config = tmp_path / "ssh_config"
    config.write_text(f"""\
Host viaexec
    User cr
    IdentityFile {cluster.key_path}
Match originalhost viaexec exec "test -d /"
    HostName {cluster.host('node1').address}
""")
    cr.env["CLUSTERRUN_SSH_CONFIG"] = str(config)
    inv = cr.inventory(hosts=1, job={"args": ["--steps", "1", "--no-dist"]}, top={"timeouts": FAST},
                       edit_hosts=lambda hosts: hosts.__setitem__(slice(None), [{"name": "x", "host": "viaexec"}]))
    dry = cr.run("launch", "--dry-run", inv)
    assert f"hostname {cluster.host('node1').address} (ssh -G)" in dry.stdout, dry.stdout
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    assert "[x r0] worker rank 0/1 on node1" in done.stdout


BRIDGE = ("import os, select, socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); "
          "fds = [0, s.fileno()]\n"
          "while True:\n"
          "    for fd in select.select(fds, [], [])[0]:\n"
          "        data = os.read(fd, 65536)\n"
          "        if not data: sys.exit(0)\n"
          "        (s.sendall if fd == 0 else lambda d: os.write(1, d))(data)\n")


def test_proxycommand_runs_through_the_shell_and_a_failing_one_says_why(cr, cluster, tmp_path):
    """Issue 21: ProxyCommand went to execvp without a shell (a `$(...)` or a pipe broke it) and its stderr
    was never read; now it runs as OpenSSH runs it (sh -c "exec ..."), and what it printed is in the error."""
    import sys

    bridge = tmp_path / "bridge.py"
    bridge.write_text(BRIDGE)
    config = tmp_path / "ssh_config"
    config.write_text(f"""\
Host viaproxy
    HostName {cluster.host('node1').address}
    User cr
    IdentityFile {cluster.key_path}
    ProxyCommand {sys.executable} {bridge} %h $(echo %p)
Host broken
    HostName {cluster.host('node2').address}
    User cr
    IdentityFile {cluster.key_path}
    ProxyCommand echo "proxy: no route to %h" >&2; exit 3
""")
    cr.env["CLUSTERRUN_SSH_CONFIG"] = str(config)
    inv = cr.inventory(edit_hosts=lambda hosts: hosts.__setitem__(slice(None), [{"name": "p", "host": "viaproxy"}]))
    done = cr.run("exec", inv, "--", "hostname")
    assert done.returncode == 0 and "node1" in done.stdout, done.stdout + done.stderr
    inv = cr.inventory("bad.yaml", edit_hosts=lambda hosts: hosts.__setitem__(slice(None),
                                                                            [{"name": "b", "host": "broken"}]))
    done = cr.run("exec", inv, "--json", "--", "hostname")
    assert done.returncode == 3, done.stdout + done.stderr
    (answer,) = json.loads(done.stdout)
    assert f"said: proxy: no route to {cluster.host('node2').address}" in answer["error"], answer
    assert "Traceback" not in done.stderr  # paramiko's threads no longer print their own copy


def test_the_first_jump_hosts_own_proxyjump_and_proxycommand_are_followed(cr, cluster, tmp_path,
                                                                          no_direct_route_to):
    """Issue 38: `inner` says ProxyJump mid and `mid` says ProxyJump gate: ssh goes gate -> mid -> inner,
    clusterrun tried mid directly. And a first jump host that its own block reaches through a ProxyCommand."""
    import sys

    n = {name: cluster.host(name).address for name in ("node0", "node1", "node2", "node3")}
    bridge = tmp_path / "bridge.py"
    bridge.write_text(BRIDGE)
    key = cluster.key_path
    config = tmp_path / "ssh_config"
    config.write_text(f"""\
Host gate
    HostName {n['node0']}
Host mid
    HostName {n['node1']}
    ProxyJump gate
Host inner
    HostName {n['node2']}
    ProxyJump mid
Host viaproxy
    HostName {n['node0']}
    ProxyCommand {sys.executable} {bridge} %h %p
Host inner3
    HostName {n['node3']}
    ProxyJump viaproxy
Host *
    User cr
    IdentityFile {key}
""")
    cr.env["CLUSTERRUN_SSH_CONFIG"] = str(config)
    for name in ("node1", "node2", "node3"):
        no_direct_route_to(n[name])
    inv = cr.inventory(edit_hosts=lambda hosts: hosts.__setitem__(slice(None), [
        {"name": "inner", "host": "inner", "addr": n["node2"]}, {"name": "inner3", "host": "inner3",
                                                                   "addr": n["node3"]}]))
    dry = cr.run("launch", "--dry-run", inv)
    assert dry.returncode == 0, dry.stderr
    assert f"proxyjump cr@{n['node0']}:22 -> cr@{n['node1']}:22 (ssh config {config}:8)" in dry.stdout, dry.stdout
    assert f"{bridge} {n['node0']} 22 (to reach the first jump) (ssh config {config}:11)" in dry.stdout
    done = cr.run("exec", inv, "--json", "--", "hostname")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(o["stdout"].strip() for o in json.loads(done.stdout)) == ["node2", "node3"]


def sshd_reload(cluster, host):
    """SIGHUP the host's sshd (tini's only child) so it rereads its config; new connections get it."""
    rc, out, err = cluster.exec(host, ["sh", "-c", "kill -HUP $(cat /proc/1/task/1/children)"], user="root")
    assert rc == 0, err
    time.sleep(0.5)


def test_many_hosts_behind_one_jump_host_are_paced_under_its_max_startups(cr, cluster, tmp_path):
    """Issue 26: every host behind a jump host needs its own connection there, and a launch opened them all
    at once: past sshd's MaxStartups the jump host turns the rest away before its banner. Connections to
    one sshd are now paced (at most 8 between TCP connect and authentication), and one turned away lowers
    that and is tried again: with MaxStartups 2:100:2 on the jump host (a third unauthenticated
    connection is always refused), 6 hosts behind it (two per machine) all answer, round after round."""
    n = {name: cluster.host(name).address for name in ("node0", "node1", "node2", "node3")}
    conf = tmp_path / "ssh_config"
    conf.write_text(f"Host gate\n    HostName {n['node0']}\n    User cr\n    IdentityFile {cluster.key_path}\n" +
                    "".join(f"Host t{i}\n    HostName {n[f'node{1 + i % 3}']}\n    User cr\n    IdentityFile "
                            f"{cluster.key_path}\n    ProxyJump gate\n" for i in range(6)))
    cr.env["CLUSTERRUN_SSH_CONFIG"] = str(conf)
    inv = cr.inventory(edit_hosts=lambda hosts: hosts.__setitem__(slice(None), [
        {"name": f"t{i}", "host": f"t{i}", "addr": n[f"node{1 + i % 3}"]} for i in range(6)]))
    # zz-: sshd takes the last MaxStartups it reads (not the first, as for most keywords)
    rc, _, err = cluster.exec("node0", ["sh", "-c", "echo 'MaxStartups 2:100:2' > "
                                                    "/etc/ssh/sshd_config.d/zz-maxstartups.conf"], user="root")
    assert rc == 0, err
    sshd_reload(cluster, "node0")
    try:
        for _ in range(3):
            done = cr.run("exec", inv, "--json", "--", "hostname")
            assert done.returncode == 0, done.stdout + done.stderr
            assert sorted(o["stdout"].strip() for o in json.loads(done.stdout)) == sorted(
                f"node{1 + i % 3}" for i in range(6))
    finally:
        cluster.exec("node0", ["rm", "-f", "/etc/ssh/sshd_config.d/zz-maxstartups.conf"], user="root")
        sshd_reload(cluster, "node0")
