"""clusterrun check on the container cluster: all pass on the healthy cluster, and each check broken on
purpose (port taken, firewall, another Python, a host down, a folder that is not shared, an unknown
host key) names the host and the problem. """

import json
import re
import socket
import time

import pytest

from clusterrun.check.rules import CHECKS

pytestmark = pytest.mark.integration

HOSTS = ["node0", "node1", "node2", "node3"]
# SO_REUSEADDR: a connection of an earlier run in TIME_WAIT on the port must not stop the holder
TAKE_PORT = ("python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
             "socket.SO_REUSEADDR, 1); s.bind((\"\", int(sys.argv[1]))); s.listen(1); print(\"up\", flush=True); "
             "time.sleep(120)' {port}")


def check(cr, inv, timeout=120):
    """(exit code, JSON report, seconds) of `clusterrun check --json`."""
    t0 = time.monotonic()
    done = cr.run("check", inv, "--json", timeout=timeout)
    seconds = time.monotonic() - t0
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout), seconds


def by_host(report):
    return {h["host"]: h["checks"] for h in report["hosts"]}


def statuses(report, check_name):
    return {h: c[check_name]["status"] for h, c in by_host(report).items()}


def test_the_healthy_cluster_passes_every_check(cr, cluster):
    inv = cr.inventory()
    code, report, seconds = check(cr, inv)
    assert code == 0, report
    assert report["ok"] and report["exit_code"] == 0 and report["checks"] == list(CHECKS)
    assert report["master"] == {"addr": cluster.hosts[0].address, "port": 29500}
    hosts = by_host(report)
    assert list(hosts) == HOSTS and all(set(c) == set(CHECKS) for c in hosts.values())
    for name, c in hosts.items():
        skipped = {"cuda": "skip", "shared": "skip"} if name == "node0" else {"cuda": "skip", "port": "skip", "shared": "skip"}
        skipped["gpu"] = "skip"  # gloo, no gpus: the run uses no GPU (docs/gpus.md)
        if name == "node3":
            skipped["relay"] = "skip"  # the last host of the relay chain passes nothing on
        assert {k: v["status"] for k, v in c.items() if v["status"] != "ok"} == skipped
        assert c["python"]["data"] == {"version": c["python"]["data"]["version"], "executable": "/opt/venv/bin/python"}
        assert c["torch"]["data"]["version"] == "2.13.0+cpu"
        # eth0 on a fresh cluster; a host crashed and started again by an earlier test gets its network anew
        assert c["iface"]["data"]["iface"].startswith("eth") and c["iface"]["data"]["source"] == cluster.host(name).address
    assert hosts["node0"]["port"]["detail"] == "29500 is free on node0"
    print(f"\ncheck, 4 healthy hosts: {seconds:.2f} s (the report's own: {report['seconds']:.2f} s)")


def test_master_port_taken_on_node0_fails_the_port_check_and_names_the_holder(cr, ssh):
    holder = ssh("node0").spawn(TAKE_PORT.format(port=29500))
    try:
        assert holder.readline(timeout=20).strip() == "up"
        code, report, _ = check(cr, cr.inventory())
    finally:
        holder.kill()  # by its recorded process group
    assert code == 1 and not report["ok"]  # a check failed on a host it reached: not a connection failure
    port = by_host(report)["node0"]["port"]
    assert port["status"] == "fail" and "master port 29500 is in use on node0" in port["detail"]
    assert f"pid {holder.pid}" in port["detail"] and "user cr" in port["detail"]
    assert statuses(report, "connect") == dict.fromkeys(HOSTS, "skip")  # nothing of ours to connect to
    assert [h["host"] for h in report["hosts"] if not h["ok"]] == ["node0"]


def test_no_route_from_a_worker_to_the_master_fails_its_connect_check(cr, cluster):
    cluster.block("node2", "node0")  # node2's packets to node0 go nowhere: connect fails at once
    code, report, _ = check(cr, cr.inventory())
    assert code == 1
    assert statuses(report, "connect") == {"node0": "ok", "node1": "ok", "node2": "fail", "node3": "ok"}
    connect = by_host(report)["node2"]["connect"]
    assert "cannot reach" in connect["detail"] and "no route" in connect["detail"]
    assert by_host(report)["node2"]["iface"]["status"] == "fail"


def test_a_firewall_that_drops_packets_makes_the_connect_check_time_out(cr, cluster):
    cluster.block("node0", "node2")  # node0's answers to node2 vanish: node2 waits, like behind a DROP rule
    code, report, _ = check(cr, cr.inventory())
    assert code == 1
    assert statuses(report, "connect") == {"node0": "ok", "node1": "ok", "node2": "fail", "node3": "ok"}
    connect = by_host(report)["node2"]["connect"]
    assert connect["data"]["status"] == "timeout" and "a firewall drops the packets" in connect["detail"]
    assert "allow TCP" in connect["hint"]


def test_a_host_that_cannot_reach_the_next_one_warns_that_relay_pushes_fall_back(cr, cluster):
    cluster.block("node1", "node2")  # the relay chain's link node1 -> node2 is cut; everything else works
    code, report, _ = check(cr, cr.inventory())
    assert statuses(report, "relay") == {"node0": "ok", "node1": "warn", "node2": "ok", "node3": "skip"}
    relay = by_host(report)["node1"]["relay"]
    assert relay["detail"].startswith(f"cannot connect to node2 ({cluster.host('node2').address}): no route")
    assert "fall back to direct pushes" in relay["detail"] and "relay: false" in relay["hint"]
    assert by_host(report)["node0"]["relay"]["detail"].startswith(f"→ node1 ({cluster.host('node1').address}) in ")
    off = cr.inventory("off.yaml", top={"push": {"relay": False}})
    code, report, _ = check(cr, off)
    assert statuses(report, "relay") == dict.fromkeys(HOSTS, "skip")


def test_another_python_on_one_host_is_named(cr):
    def edit(hosts):
        hosts[2]["python"] = "/usr/bin/python3"  # Debian's Python: same 3.11, no torch
        hosts[3]["python"] = "/usr/bin/python9"  # no such interpreter

    code, report, _ = check(cr, cr.inventory(edit_hosts=edit))
    assert code == 1
    hosts = by_host(report)
    assert statuses(report, "torch") == {"node0": "ok", "node1": "ok", "node2": "fail", "node3": "skip"}
    assert "torch does not import with /usr/bin/python3" in hosts["node2"]["torch"]["detail"]
    assert "No module named 'torch'" in hosts["node2"]["torch"]["detail"]
    assert "torch 2.13.0+cpu" in hosts["node2"]["torch"]["hint"]
    assert hosts["node2"]["python"]["status"] == "ok"  # same minor version: no mismatch to report
    assert hosts["node3"]["python"]["status"] == "fail" and "no Python at /usr/bin/python9" in \
        hosts["node3"]["python"]["detail"]
    assert [h["host"] for h in report["hosts"] if not h["ok"]] == ["node2", "node3"]


def test_an_unreachable_host_fails_alone_and_the_others_are_still_checked(cr, cluster):
    cluster.crash("node3")
    inv = cr.inventory()  # timeouts.connect: 5 s
    code, report, seconds = check(cr, inv)
    assert code == 3
    hosts = by_host(report)
    assert hosts["node3"]["ssh"]["status"] == "fail" and "unreachable" in hosts["node3"]["ssh"]["detail"]
    assert {c["status"] for name, c in hosts["node3"].items() if name != "ssh"} == {"skip"}
    assert [h["host"] for h in report["hosts"] if not h["ok"]] == ["node3"]
    assert statuses(report, "connect") == {"node0": "ok", "node1": "ok", "node2": "ok", "node3": "skip"}
    print(f"\ncheck, node3 down (connect timeout 5 s): {seconds:.2f} s")


def test_with_rank0s_host_down_the_others_do_not_wait_for_it_twice(cr, cluster):
    cluster.crash("node0")
    code, report, seconds = check(cr, cr.inventory())  # timeouts.connect: 5 s
    assert code == 3 and [h["host"] for h in report["hosts"] if not h["ok"]] == ["node0"]
    hosts = by_host(report)
    assert {hosts[h]["connect"]["detail"] for h in HOSTS[1:]} == {"node0 was not reachable"}
    assert {hosts[h]["torch"]["status"] for h in HOSTS[1:]} == {"ok"}
    # torch was imported while node0's connect timed out, not after it
    fastest_import = min(hosts[h]["torch"]["data"]["seconds"] for h in HOSTS[1:])
    assert report["seconds"] < 5 + fastest_import, (report["seconds"], fastest_import)
    print(f"\ncheck, node0 down (connect timeout 5 s): {seconds:.2f} s")


def test_file_init_needs_one_shared_folder(cr, cluster):
    code, report, _ = check(cr, cr.inventory(job={"init_method": "file", "shared_dir": "/shared"}))
    assert code == 0, report
    assert statuses(report, "shared") == dict.fromkeys(HOSTS, "ok")
    assert by_host(report)["node1"]["shared"]["detail"] == "sees node0's test file in /shared"
    assert [p.name for p in cluster.shared_dir.iterdir() if p.name.startswith(".clusterrun-check")] == []
    code, report, _ = check(cr, cr.inventory(job={"init_method": "file", "shared_dir": "/tmp"}))
    assert code == 1
    assert statuses(report, "shared") == {"node0": "ok", "node1": "fail", "node2": "fail", "node3": "fail"}
    assert "/tmp is not shared with node0" in by_host(report)["node1"]["shared"]["detail"]
    rc, out, _ = cluster.exec("node0", ["sh", "-c", "ls -a /tmp"])
    assert ".clusterrun-check" not in out  # the token file went with the listener


def test_an_unknown_host_key_is_refused_by_the_strict_policy(cr, tmp_path):
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")

    def edit(hosts):
        hosts[1]["known_hosts"] = str(empty)

    code, report, _ = check(cr, cr.inventory(edit_hosts=edit))
    assert code == 3
    ssh_check = by_host(report)["node1"]["ssh"]
    assert ssh_check["status"] == "fail" and "policy strict refuses hosts not in known_hosts" in ssh_check["detail"]
    assert "ssh-keyscan" in ssh_check["hint"]
    assert [h["host"] for h in report["hosts"] if not h["ok"]] == ["node1"]


def test_the_table_and_nothing_left_listening(cr, cluster):
    done = cr.run("check", cr.inventory())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all 4 hosts pass" in done.stdout and all(f"{h} " in done.stdout for h in HOSTS)
    socket.create_connection((cluster.hosts[1].address, 22), timeout=5).close()  # the hosts are up ...
    with pytest.raises(OSError):  # ... and the listener is gone from the master port
        socket.create_connection((cluster.hosts[0].address, 29500), timeout=2).close()


def test_a_second_interface_gets_a_socket_ifname_hint_and_a_wrong_one_fails(cr, cluster):
    # a veth pair inside node1: a second interface that sends nothing anywhere
    rc, _, err = cluster.exec("node1", ["sh", "-c", "ip link add crv0 type veth peer name crv1 && "
                                        "ip addr add 198.18.250.1/32 dev crv0 && ip link set crv1 up && "
                                        "ip link set crv0 up"], user="root")
    assert rc == 0, err

    def edit(hosts):
        hosts[1]["network"] = {"ifname": "none"}  # torch's own choice: the hint names the variable to set
        hosts[2]["env"] = {"GLOO_SOCKET_IFNAME": "ens9"}

    try:
        code, report, _ = check(cr, cr.inventory(edit_hosts=edit))
    finally:
        cluster.exec("node1", ["ip", "link", "del", "crv0"], user="root")
    iface = by_host(report)["node1"]["iface"]
    eth = re.search(r"2 interfaces \(crv0, (eth\d+)\)", iface["detail"])  # eth0 unless the host was restarted
    assert iface["status"] == "ok" and eth, iface["detail"]
    assert iface["hint"] == f"set env: {{GLOO_SOCKET_IFNAME: {eth[1]}}} for this host in the inventory"
    wrong = by_host(report)["node2"]["iface"]
    assert wrong["status"] == "fail" and "GLOO_SOCKET_IFNAME=ens9 but this host has no IPv4 interface ens9" in \
        wrong["detail"]
    assert code == 1 and [h["host"] for h in report["hosts"] if not h["ok"]] == ["node2"]
    auto = by_host(report)["node3"]["iface"]  # network.ifname auto (the default): clusterrun sets it, no hint
    assert auto["status"] == "ok" and not auto["hint"] and "ranks get GLOO/NCCL_SOCKET_IFNAME=eth" in auto["detail"]
