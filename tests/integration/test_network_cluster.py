"""The network is found, not guessed (issue 24), on a cluster whose hosts have two interfaces: the inventory's
addresses on the second one (eth1; the default route stays on eth0) and every host's own name mapped to
127.0.1.1 in /etc/hosts, as Debian and Ubuntu ship it. With `network.ifname: auto` (the default) launch
gives the ranks GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=eth1 and works; with `none` gloo binds loopback,
the launch fails, and the root cause names 127.0.1.1 and the fix. `check` names the loopback name and the
interface per host; `check --net` finds the link a token bucket (tc tbf) caps.
"""

from __future__ import annotations

import json
import time

import pytest

from clusterkit import CR

pytestmark = pytest.mark.integration

HOSTS = ["node0", "node1", "node2", "node3"]


@pytest.fixture
def net(netcluster, tmp_path):
    """The CLI against the two-NIC cluster; afterwards its faults undone and no process of cr left."""
    netcluster.restore()
    yield CR(netcluster, tmp_path, tmp_path / "cr-home")
    netcluster.restore()
    left = netcluster.orphans()
    deadline = time.monotonic() + 3.0
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = netcluster.orphans()
    for host in {p.host for p in left}:
        netcluster.kill(host, [p.pid for p in left if p.host == host])
    assert not left, "the test left processes of cr on the network cluster:\n" + "\n".join(map(str, left))


@pytest.fixture
def loopback_names(netcluster):
    """Every host's own name on 127.0.1.1 (restored by the `net` fixture's restore())."""
    for h in netcluster.hosts:
        netcluster.loopback_name(h)
    yield
    for h in netcluster.hosts:
        netcluster.own_name(h)


def inventory(net, name="inv.yaml", top=None, job=None):
    """The cluster's inventory, every host's addr: on its second interface (ssh still on the first)."""
    def second_addrs(hosts):
        for h, info in zip(hosts, net.cluster.hosts):
            h["addr"] = info.address2

    return net.inventory(name, top=top, job={"timeout": "20s", **(job or {})}, edit_hosts=second_addrs)


def test_launch_with_the_defaults_gives_every_host_the_interface_toward_rank_0(net, netcluster, loopback_names):
    inv = inventory(net)
    dry = net.run("launch", inv, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"# node1 interface: auto: the interface that carries the route to {netcluster.hosts[0].address2}" \
        in dry.stdout
    done = net.run("launch", inv, "--", "--steps", "2", timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=eth1 on every host" in done.stderr
    record = net.ps()[0]
    assert record["state"] == "succeeded"
    chosen = record["network"]
    assert {h: c["ifname"] for h, c in chosen.items()} == {h: "eth1" for h in HOSTS}
    rank0 = netcluster.hosts[0].address2
    assert chosen["node0"]["why"] == f"auto: eth1 holds {rank0} itself"
    assert chosen["node1"]["why"] == f"auto: eth1 carries the route {netcluster.subnet2} to {rank0}"
    assert chosen["node2"]["env"] == ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]


def test_with_ifname_none_gloo_binds_loopback_and_the_root_cause_says_so(net, netcluster, loopback_names):
    done = net.run("launch", inventory(net, top={"network": {"ifname": "none"}}), timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    hint = next(line for line in done.stderr.splitlines() if line.startswith("hint:"))
    assert "127.0.1.1" in hint and "loopback" in hint
    assert "network.ifname: auto" in hint and "/etc/hosts" in hint
    assert net.ps()[0]["network"]["node1"]["ifname"] is None


def test_check_names_the_loopback_name_and_the_interface_of_every_host(net, netcluster, loopback_names):
    done = net.run("check", inventory(net), "--json", timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    report = {h["host"]: h["checks"] for h in json.loads(done.stdout)["hosts"]}
    for name in HOSTS:
        iface = report[name]["iface"]
        assert (iface["status"], iface["data"]["iface"]) == ("ok", "eth1"), iface
        assert f"hostname {name} resolves to 127.0.1.1" in iface["detail"] and "/etc/hosts" in iface["hint"]
        assert report[name]["addr"]["status"] == "ok" and report[name]["addr"]["data"]["ips"] == \
            [netcluster.host(name).address2]
        assert report[name]["mtu"]["status"] == "ok" and report[name]["dns"]["status"] == "ok"

    done = net.run("check", inventory(net, "none.yaml", top={"network": {"ifname": "none"}}), "--json", timeout=120)
    assert done.returncode == 1, done.stdout[-2000:]  # a failing check; 3 is for unreachable hosts only
    failed = {h["host"]: h["checks"]["iface"] for h in json.loads(done.stdout)["hosts"]}
    assert all(f["status"] == "fail" and "127.0.1.1" in f["detail"] for f in failed.values()), failed


def test_check_net_finds_the_link_a_token_bucket_caps(net, netcluster):
    capped = netcluster.host("node2")
    dev = netcluster.shape(capped, "100mbit", address=capped.address2)
    assert dev == "eth1"
    t0 = time.monotonic()
    done = net.run("check", inventory(net), "--net", "--json", timeout=120)
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["rounds"] == 3 and len(report["links"]) == 10  # 2 rounds of pairs + node0-node3, both ways
    assert {h: i["ifname"] for h, i in report["interfaces"].items()} == {h: "eth1" for h in HOSTS}
    assert report["interfaces"]["node2"]["bound"] == capped.address2
    slow = {(x["from"], x["to"]) for x in report["links"] if x["slow"]}
    sent_by_node2 = {(x["from"], x["to"]) for x in report["links"] if x["from"] == "node2"}
    assert sent_by_node2 and sent_by_node2 <= slow  # what node2 sends goes through the 100 Mbit/s bucket
    capped_rates = [x["mbps"] for x in report["links"] if x["from"] == "node2"]
    assert max(capped_rates) < 150, capped_rates
    # another link called slow can only be this machine's 2 cores being busy elsewhere, never a cap like it
    others = [x["mbps"] for x in report["links"] if x["slow"] and "node2" not in (x["from"], x["to"])]
    assert all(rate > 3 * max(capped_rates) for rate in others), report["links"]
    print(f"\ncheck --net on 4 hosts: {wall:.2f} s wall ({report['seconds']:.2f} s measuring); "
          f"median {report['median_mbps']:.0f} Mbit/s; node2 → x {capped_rates} Mbit/s")
