"""`clusterrun check`'s network rules for network.ifname (iface, addr, dns, mtu) on canned facts, and
`check --net`: its rounds of pairs, its verdicts, and the host program's measuring sockets (bound,
authenticated both ways, only the expected peer) on this machine's loopback."""

import math
import threading

import pytest

from clusterrun.check.links import judged, pair_links, rounds
from clusterrun.check.net_rules import addr_result, dns_result, iface_result, mtu_results, used_interface
from clusterrun.remote.host.net import bandwidth
from support import inventory_text, write_tree

CHOICE = {"dest": "10.0.0.10", "ifname": "eth1", "why": "eth1 carries the route 10.0.0.0/24 to 10.0.0.10", "mtu": 1500,
          "interfaces": [{"name": "lo", "addrs": ["127.0.0.1"], "mtu": 65536, "up": True},
                         {"name": "eth0", "addrs": ["192.168.1.11"], "mtu": 1500, "up": True},
                         {"name": "eth1", "addrs": ["10.0.0.11"], "mtu": 1500, "up": True}]}
NET = {"master_ip": "10.0.0.10", "source": "10.0.0.11", "hostname": "n1", "hostname_addrs": ["127.0.1.1"],
       "interfaces": [{"name": "lo", "addr": "127.0.0.1", "up": True}, {"name": "eth0", "addr": "192.168.1.11", "up": True},
                      {"name": "eth1", "addr": "10.0.0.11", "up": True}],
       "choice": CHOICE, "own": {"addr": "10.0.0.11", "ips": ["10.0.0.11"], "error": ""},
       "lookups": [{"name": "n1", "what": "own name", "addrs": ["127.0.1.1"], "seconds": 0.002, "error": ""}]}


def test_a_loopback_name_fails_with_ifname_none_and_is_a_note_with_auto():
    none = iface_result(NET, "gloo", {}, multi_host=True, mode="none")
    assert none.status == "fail" and "hostname n1 resolves to 127.0.1.1" in none.detail
    auto = iface_result(NET, "gloo", {}, multi_host=True, mode="auto")
    assert (auto.status, auto.short) == ("ok", "eth1")
    assert "ranks get GLOO/NCCL_SOCKET_IFNAME=eth1" in auto.detail and "hostname n1 resolves to 127.0.1.1" in auto.detail
    assert "clusterrun sets GLOO_SOCKET_IFNAME=eth1" in auto.detail and "/etc/hosts" in auto.hint
    good = iface_result({**NET, "hostname_addrs": ["10.0.0.11"]}, "gloo", {}, multi_host=True, mode="auto")
    assert good.status == "ok" and not good.hint and "Note" not in good.detail


def test_auto_that_found_nothing_judges_as_torch_would_pick():
    lost = iface_result({**NET, "choice": {**CHOICE, "ifname": None}}, "gloo", {}, multi_host=True, mode="auto")
    assert lost.status == "fail" and "network.ifname: eth1" in lost.hint


def test_a_named_interface_must_exist_and_should_be_the_one_toward_rank_0():
    missing = iface_result(NET, "gloo", {}, multi_host=True, mode="ib0")
    assert missing.status == "fail" and "network.ifname is ib0" in missing.detail and "eth1" in missing.hint
    other = iface_result(NET, "nccl", {}, multi_host=True, mode="eth0")
    assert other.status == "warn" and "leaves via eth1" in other.detail
    named = iface_result(NET, "gloo", {}, multi_host=True, mode="eth1")
    assert (named.status, named.short) == ("ok", "eth1")
    assert iface_result(NET, "gloo", {"GLOO_SOCKET_IFNAME": "ens5"}, True, mode="auto").status == "fail"  # env wins


def test_addr_must_be_an_address_of_the_host():
    assert addr_result(NET, "10.0.0.11", True, "ssh").short == "eth1"
    away = addr_result({**NET, "own": {"ips": ["203.0.113.5"]}}, "203.0.113.5", True, "ssh")
    assert away.status == "fail" and "is not an address of this host (it has eth0 192.168.1.11, eth1 10.0.0.11)" \
        in away.detail and "set addr:" in away.hint
    implicit = addr_result({**NET, "own": {"ips": ["203.0.113.5"]}}, "gpu1", False, "ssh")
    assert implicit.status == "warn" and "host: (there is no addr:)" in implicit.detail
    name = addr_result({**NET, "own": {"ips": [], "error": "no answer within 3 s"}}, "gpu1", True, "ssh")
    assert name.status == "warn" and "does not resolve on this host: no answer within 3 s" in name.detail


def test_a_slow_lookup_is_a_dead_dns():
    assert dns_result(NET).status == "ok"
    dead = {**NET, "lookups": NET["lookups"] + [{"name": "node0", "what": "rank 0's addr", "addrs": [],
                                                 "seconds": 3.0, "error": "no answer within 3 s"}]}
    r = dns_result(dead)
    assert r.status == "warn" and "looking up rank 0's addr node0 took 3.0 s (no answer within 3 s)" in r.detail
    assert "/etc/resolv.conf" in r.hint and r.short == "3.0 s"
    slow = dns_result({**NET, "lookups": [{**NET["lookups"][0], "seconds": 1.4}]})
    assert slow.status == "warn" and "own name n1 took 1.4 s" in slow.detail


def test_mtus_must_agree_on_the_interfaces_the_ranks_use():
    jumbo = {**CHOICE, "interfaces": [{**i, "mtu": 9000} if i["name"] == "eth1" else i for i in CHOICE["interfaces"]]}
    used = {"n0": used_interface(NET, "auto", {}, "gloo"), "n1": used_interface(NET, "auto", {}, "gloo"),
            "n2": used_interface({**NET, "choice": jumbo}, "auto", {}, "gloo")}
    assert used["n0"] == ("eth1", 1500) and used["n2"] == ("eth1", 9000)
    results, notes = mtu_results(used)
    assert results["n0"].status == "ok" and results["n2"].status == "warn"
    assert "MTU 9000 here, but 1500 on n0, n1" in results["n2"].detail
    assert notes == ["MTU differs between hosts: 1500 on n0, n1; 9000 on n2"]
    assert used_interface(NET, "none", {}, "gloo") == ("eth1", 1500)  # none: where the kernel sends
    assert used_interface(NET, "auto", {"NCCL_SOCKET_IFNAME": "eth0"}, "nccl") == ("eth0", 1500)


def test_check_and_a_launch_derive_the_ranks_interface_alike():
    """One derivation (plan.chosen_interface): what check says the ranks use is what a launch gives them."""
    from dataclasses import replace

    from hostkit import make_host

    from clusterrun.plan import net_choice

    for mode in ("auto", "eth0", "eth1", "none"):
        choice = net_choice(replace(make_host("/w"), ifname=mode), CHOICE, "10.0.0.10")
        used = used_interface(NET, mode, {}, "gloo")
        assert used == ((choice.ifname, choice.mtu) if choice.ifname else ("eth1", 1500)), mode
    found_none = net_choice(replace(make_host("/w"), ifname="auto"), {**CHOICE, "ifname": None}, "10.0.0.10")
    assert found_none.ifname is None and used_interface({**NET, "choice": {**CHOICE, "ifname": None}}, "auto", {},
                                                        "gloo") == ("eth1", 1500)  # torch's pick: the route's


# ------------------------------------------------------------------ check --net


@pytest.mark.parametrize("n", range(1, 18))
def test_rounds_pair_each_host_once_a_round_and_reach_rank_0_from_everyone(n):
    schedule = rounds(n)
    for pairs in schedule:
        ends = [h for p in pairs for h in p]
        assert len(ends) == len(set(ends))  # disjoint: a host measures one link at a time
    links = {p for r in schedule for p in r}
    assert {(0, j) for j in range(1, n)} <= links
    hypercube = {(i, i ^ (1 << k)) for k in range(math.ceil(math.log2(n)) if n > 1 else 0) for i in range(n)
                 if i < i ^ (1 << k) < n}
    assert hypercube <= links and links == hypercube | {(0, j) for j in range(1, n)}
    assert len(schedule) == max(n - 1, 0)  # rank 0's host meets every other host, one per round


def test_rounds_of_4_hosts():
    assert rounds(4) == [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3)]]


def test_a_link_under_half_the_median_is_slow():
    fast = {"received": 125_000_000, "receive_s": 0.1}  # 10 Gbit/s
    slow = {"received": 12_500_000, "receive_s": 1.0}  # 100 Mbit/s
    links = []
    for a, b, at_a, at_b in [("n0", "n1", fast, fast), ("n2", "n3", fast, slow), ("n0", "n2", fast, fast)]:
        links += pair_links(a, b, {**at_a, "rtt_ms": 0.05}, at_b)
    marked, median = judged(links)
    assert median == 10000.0
    assert [(x.src, x.dst) for x in marked if x.slow] == [("n2", "n3")]
    assert marked[2].mbps == 100.0 and marked[2].rtt_ms == 0.05
    failed = pair_links("n0", "n3", {"error": "cannot reach 10.0.0.13:4000: refused"}, {})
    assert failed[0].mbps is None and "refused" in failed[1].error


def test_one_slow_moment_is_not_a_slow_link_and_the_noise_is_said():
    """On a loaded machine one short measurement of a link can come out at 0.45 of the median: the median
    of its few measurements decides (issue 36), and the report says how much they varied."""
    from clusterrun.check.links import Link, NetReport, combined, noise, noise_text, slow_text

    def link(src, dst, mbps):
        return Link(src, dst, mbps, 1000, 0.1, 0.05)

    passes = [[link("a", "b", 1000.0), link("b", "a", 1000.0), link("a", "c", 1000.0), link("c", "a", 100.0)],
              [link("a", "b", 450.0), link("b", "a", 1000.0), link("a", "c", 1100.0), link("c", "a", 90.0)],
              [link("a", "b", 1000.0), link("b", "a", 900.0), link("a", "c", 1000.0), link("c", "a", 110.0)]]
    marked, median = judged(combined([x for p in passes for x in p]))
    assert median == 1000.0
    by = {(x.src, x.dst): x for x in marked}
    assert not by[("a", "b")].slow and by[("a", "b")].mbps == 1000.0  # 450 once, 1000 twice: not slow
    assert by[("c", "a")].slow and by[("c", "a")].mbps == 100.0 and by[("c", "a")].samples == (100.0, 90.0, 110.0)
    assert by[("a", "b")].received == 3000 and by[("a", "b")].seconds == 0.3
    assert slow_text(by[("c", "a")], median) == ("c → a: 100 Mbit/s (median of 3: 90 Mbit/s-110 Mbit/s), "
                                                 "under half the median (1.00 Gbit/s)")
    assert noise(marked) == 0.15  # the median of the spreads 0.55, 0.1, 0.1, 0.2
    report = NetReport(("a", "b", "c"), marked, {}, {}, median, 1.0, 2, 32.0, repeats=3, noise=noise(marked))
    assert noise_text(report) == "each link measured 3 times, the median kept; a link's measurements varied by " \
                                 "15% typically"
    assert report.to_json()["noise"] == 0.15 and report.to_json()["links"][0]["samples"] == [1000.0, 450.0, 1000.0]
    # a link no measurement got through keeps its error
    failed = combined([Link("a", "d", None, error="refused"), Link("a", "d", None, error="refused")])
    assert failed[0].mbps is None and failed[0].error == "refused"


def _pair(server_job, client_job, token=("t" * 32, "t" * 32)):
    """A serving and a connecting Bench of the host program on this machine's loopback, at once."""
    server = bandwidth.Bench({"token": token[0], "addr": "127.0.0.1"})
    client = bandwidth.Bench({"token": token[1], "addr": "127.0.0.1"})
    out = {}

    def serve():
        try:
            out["server"] = server.serve(server_job)
        except bandwidth.PairError as exc:
            out["server"] = {"error": str(exc)}

    t = threading.Thread(target=serve)
    t.start()
    try:
        out["client"] = client.connect({**client_job, "port": server.server.getsockname()[1]})
    except bandwidth.PairError as exc:
        out["client"] = {"error": str(exc)}
    t.join(10)
    server.server.close()
    client.server.close()
    return out


JOB = {"pair": "p1", "seconds": 1.0, "bytes": 4 << 20, "pings": 3, "timeout": 3.0}


def test_the_measuring_sockets_exchange_both_ways_once_both_ends_prove_the_token():
    out = _pair({**JOB, "peer": "127.0.0.1"}, {**JOB, "addr": "127.0.0.1"})
    assert out["server"]["received"] == out["client"]["received"] == 4 << 20
    assert out["client"]["rtt_ms"] > 0 and "rtt_ms" not in out["server"]
    assert bandwidth.Bench({"token": "x", "addr": "127.0.0.1"}).ready("127.0.0.1")["bound"] == "127.0.0.1"


def test_a_wrong_token_is_refused_before_any_byte_is_measured():
    out = _pair({**JOB, "peer": "127.0.0.1", "timeout": 1.0}, {**JOB, "addr": "127.0.0.1", "timeout": 1.0},
                token=("a" * 32, "b" * 32))
    assert "did not prove the check's token" in out["server"]["error"]
    assert "did not accept the check's token" in out["client"]["error"]


def test_only_the_expected_peer_address_is_answered():
    out = _pair({**JOB, "peer": "127.0.0.2", "timeout": 1.0}, {**JOB, "addr": "127.0.0.1", "timeout": 1.0})
    assert "127.0.0.2 did not connect within 1s" in out["server"]["error"]
    assert "error" in out["client"]  # closed unanswered: no handshake from a listener that does not expect it


def test_the_sockets_are_bound_to_the_hosts_address():
    with pytest.raises(bandwidth.Fail, match="not an address of this host"):
        bandwidth.Bench({"token": "x", "addr": "203.0.113.77"})


def three_local(tmp_path):
    return [{"name": f"h{i}", "connection": "local", "workdir": f"{tmp_path}/w{i}"} for i in range(3)]


def test_check_net_on_three_local_hosts_through_the_cli(tmp_path, capsys, monkeypatch):
    """The whole path: the host programs started over the local transport, rounds, the matrix, JSON, the
    table."""
    import json

    from clusterrun.cli import run

    write_tree(tmp_path, {"job.py": "print(1)\n", "inv.yaml": inventory_text(three_local(tmp_path), {"script": "job.py"})})
    assert run(["check", str(tmp_path / "inv.yaml"), "--net", "--mb", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["rounds"] == 2 and report["hosts"] == ["h0", "h1", "h2"]
    assert sorted((x["from"], x["to"]) for x in report["links"]) == [("h0", "h1"), ("h0", "h2"), ("h1", "h0"),
                                                                    ("h2", "h0")]
    assert all(x["bytes"] == 1 << 20 and x["mbps"] > 0 and x["rtt_ms"] > 0 for x in report["links"])
    # each link in three short measurements (the median kept), the budget shared out between them
    assert report["repeats"] == 3 and all(len(x["samples"]) == 3 for x in report["links"]), report["links"]
    assert report["interfaces"]["h1"] == {**report["interfaces"]["h1"], "bound": "127.0.0.1", "ifname": "lo"}
    monkeypatch.setenv("COLUMNS", "200")
    assert run(["check", str(tmp_path / "inv.yaml"), "--net", "--mb", "1"]) == 0
    table = capsys.readouterr().out
    assert "from \\ to" in table and "4 of 4 directions measured" in table and "lo (127.0.0.1)" in table
    assert run(["check", str(tmp_path / "inv.yaml"), "--mb", "1"]) == 2  # --mb goes with --net


def test_a_host_that_cannot_be_reached_is_named_and_the_rest_is_measured(tmp_path):
    from clusterrun.check.bandwidth import run_net_check
    from clusterrun.config.inventory import parse_inventory
    from clusterrun.errors import ConnectError
    from clusterrun.hosts.client import make_connect

    write_tree(tmp_path, {"job.py": "print(1)\n"})
    inv = parse_inventory(inventory_text(three_local(tmp_path), {"script": "job.py"}), str(tmp_path / "inv.yaml"))
    local = make_connect(inv.timeouts)

    def connect(host):
        if host.name == "h2":
            raise ConnectError("h2", "no answer within 5 s")
        return local(host)

    report = run_net_check(inv, mb=0.5, connect=connect)
    assert not report.ok and report.unreachable == {"h2": "unreachable: no answer within 5 s"}
    assert sorted((x.src, x.dst) for x in report.links) == [("h0", "h1"), ("h1", "h0")]
    assert report.to_json()["unreachable"] == {"h2": "unreachable: no answer within 5 s"}
