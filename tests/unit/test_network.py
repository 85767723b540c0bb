"""network.ifname end to end without a network: the inventory keys, what the plan gives each host's ranks
(GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME, unless env: sets them) and why, the dry run, the run record, and
the root cause's hint for a peer at a loopback or unknown address."""

import pytest
from rich.console import Console

from clusterrun.config.inventory import parse_inventory
from clusterrun.errors import InventoryError
from clusterrun.outcome import RankResult, decide, hint_for
from clusterrun.plan import build_plan, known_addresses, plan_to_dict
from clusterrun.states import RankState
from clusterrun.ui.tables import show_plan

INV = """\
version: 1
hosts:
  - {name: n0, host: 10.0.0.10, addr: 10.1.0.10}
  - {name: n1, host: 10.0.0.11, addr: 10.1.0.11}
  - {name: n2, host: 10.0.0.12, addr: 10.1.0.12%s}
job: {script: train.py}
"""

# what each host's push found toward rank 0's addr (remote/host/net/ifaces.find)
FOUND = {
    0: {"dest": "10.1.0.10", "ifname": "eth1", "why": "eth1 holds 10.1.0.10 itself", "mtu": 9000,
        "interfaces": [{"name": "eth0", "addrs": ["10.0.0.10"], "mtu": 1500}, {"name": "eth1", "addrs": ["10.1.0.10"],
                                                                                 "mtu": 9000},
                       {"name": "docker0", "addrs": ["172.17.0.1"], "mtu": 1500}]},
    1: {"dest": "10.1.0.10", "ifname": "eth1", "why": "eth1 carries the route 10.1.0.0/16 to 10.1.0.10", "mtu": 9000,
        "interfaces": [{"name": "eth1", "addrs": ["10.1.0.11"], "mtu": 9000}]},
    2: {"dest": "10.1.0.10", "ifname": None, "why": "no route to 10.1.0.10", "interfaces": []},
}


def inv(tmp_path, host2="", top=""):
    (tmp_path / "train.py").write_text("print(1)\n")
    return parse_inventory(INV % host2 + top, str(tmp_path / "inv.yaml"))


def test_the_default_is_auto_and_network_ifname_is_read_top_level_and_per_host(tmp_path):
    assert [h.ifname for h in inv(tmp_path).hosts] == ["auto"] * 3
    hosts = inv(tmp_path, ", network: {ifname: ib0}", "network: {ifname: none}\n").hosts
    assert [(h.ifname, h.ifname_key) for h in hosts] == [("none", "network.ifname"), ("none", "network.ifname"),
                                                         ("ib0", "hosts[2].network.ifname")]


@pytest.mark.parametrize("bad, words", [
    (", network: {ifname: 'eth0; rm -rf /'}", "hosts[2].network.ifname"),
    (", network: {ifname: averyveryverylongname}", "at most 15"),
    (", network: {iface: eth0}", "hosts[2].network"),
])
def test_a_bad_ifname_names_the_key(tmp_path, bad, words):
    with pytest.raises(InventoryError) as err:
        inv(tmp_path, bad)
    assert words in str(err.value) and "inv.yaml:5" in str(err.value)


def test_auto_sets_both_variables_to_what_each_host_found(tmp_path):
    plan = build_plan(inv(tmp_path), "r1", network=FOUND)
    env = [n.ranks[0].env for n in plan.nodes]
    assert env[0]["GLOO_SOCKET_IFNAME"] == env[0]["NCCL_SOCKET_IFNAME"] == "eth1"
    assert env[1]["GLOO_SOCKET_IFNAME"] == "eth1"
    assert "GLOO_SOCKET_IFNAME" not in env[2]  # nothing found: torch's own choice, and the record says why
    n0, n1, n2 = (n.network for n in plan.nodes)
    assert n0.why == "auto: eth1 holds 10.1.0.10 itself" and n0.mtu == 9000
    assert n1.why == "auto: eth1 carries the route 10.1.0.0/16 to 10.1.0.10"
    assert n2.ifname is None and n2.why == "auto: none found (no route to 10.1.0.10): torch picks"
    record = plan_to_dict(plan)["nodes"]
    assert record[1]["network"] == {"mode": "auto", "ifname": "eth1", "why": n1.why,
                                    "env": ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"], "mtu": 9000}


def test_before_the_push_auto_sets_nothing_and_says_when_it_will_know(tmp_path):
    plan = build_plan(inv(tmp_path), "r1")
    assert all("GLOO_SOCKET_IFNAME" not in r.env for r in plan.ranks)
    assert plan.nodes[1].network.why == ("auto: the interface that carries the route to 10.1.0.10, found while "
                                         "pushing")


def test_a_name_fixes_the_interface_and_none_leaves_torch_alone(tmp_path):
    plan = build_plan(inv(tmp_path, ", network: {ifname: ib0}", "network: {ifname: none}\n"), "r1", network=FOUND)
    assert plan.nodes[2].ranks[0].env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert plan.nodes[2].network.why == "ib0 (hosts[2].network.ifname)"
    assert "GLOO_SOCKET_IFNAME" not in plan.nodes[0].ranks[0].env
    assert plan.nodes[0].network.why.startswith("none (network.ifname): torch picks")


def test_a_variable_the_user_sets_in_env_is_kept(tmp_path):
    node = build_plan(inv(tmp_path, ", env: {GLOO_SOCKET_IFNAME: eth0}"), "r1", network={**FOUND, 2: FOUND[1]}).nodes[2]
    assert node.ranks[0].env["GLOO_SOCKET_IFNAME"] == "eth0" and node.ranks[0].env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert node.network.env == ("NCCL_SOCKET_IFNAME",) and node.network.why.endswith("; GLOO_SOCKET_IFNAME from env:")


def test_torchrun_gets_the_variables_for_its_workers(tmp_path):
    text = (INV % "").replace("job: {script: train.py}", "job: {script: train.py, launcher: torchrun}")
    (tmp_path / "train.py").write_text("print(1)\n")
    plan = build_plan(parse_inventory(text, str(tmp_path / "inv.yaml")), "r1", network=FOUND)
    assert plan.nodes[1].env["GLOO_SOCKET_IFNAME"] == plan.nodes[1].env["NCCL_SOCKET_IFNAME"] == "eth1"


def test_the_dry_run_shows_each_hosts_interface_and_why(tmp_path):
    out = Console(width=300, record=True, color_system=None)
    show_plan(build_plan(inv(tmp_path, ", network: {ifname: ib0}"), "r1"), out)
    text = out.export_text()
    assert "# n0 interface: auto: the interface that carries the route to 10.1.0.10, found while pushing" in text
    assert "# n2 interface: ib0 (hosts[2].network.ifname) → GLOO_SOCKET_IFNAME=ib0 NCCL_SOCKET_IFNAME=ib0" in text
    assert "GLOO_SOCKET_IFNAME=ib0" in text.split("# n2 rank 2")[1]  # in the rank's command line too


def test_the_run_knows_whose_address_is_whose(tmp_path):
    known = known_addresses(build_plan(inv(tmp_path), "r1", network=FOUND))
    assert known["10.1.0.10"] == ("n0", "addr") and known["10.0.0.10"] == ("n0", "eth0")
    assert known["172.17.0.1"] == ("n0", "docker0") and known["10.1.0.12"] == ("n2", "addr")


GLOO = ("RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[%s]:26523")
NCCL = "n1:123:456 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to %s<37567> failed : Connection refused"


def failed(line, host="n1"):
    return RankResult(1, 1, host, RankState.FAILED, exit_code=1, tail=("Traceback (most recent call last):", line))


def test_a_peer_at_a_loopback_address_names_it_and_the_fix(tmp_path):
    known = known_addresses(build_plan(inv(tmp_path), "r1", network=FOUND))
    hint = hint_for(failed(GLOO % "127.0.1.1"), known)
    assert hint.startswith("rank 1 on n1 could not connect to 127.0.1.1:26523, a loopback address (on n1 it is "
                           "n1 itself)")
    assert "network.ifname: auto" in hint and "/etc/hosts" in hint
    assert "127.0.1.1" in hint_for(failed(NCCL % "127.0.1.1"), known)


def test_a_peer_at_an_unknown_or_a_side_interfaces_address_is_named(tmp_path):
    known = known_addresses(build_plan(inv(tmp_path), "r1", network=FOUND))
    unknown = hint_for(failed(GLOO % "203.0.113.9"), known)
    assert "203.0.113.9:26523, which is no address of any host of this run" in unknown and "/etc/hosts" in unknown
    docker = hint_for(failed(NCCL % "172.17.0.1"), known)
    assert "172.17.0.1:37567, n0's address on docker0, not on the interface the other hosts reach n0 by" in docker
    assert docker.endswith("for n0")
    assert hint_for(failed(GLOO % "10.1.0.12"), known) == ""  # n2's own address: the peer died, or a firewall
    assert hint_for(failed("ValueError: nothing to do with the network"), known) == ""


def test_the_outcome_carries_the_hint_to_the_terminal(tmp_path):
    known = known_addresses(build_plan(inv(tmp_path), "r1", network=FOUND))
    ranks = [failed(GLOO % "127.0.1.1"), RankResult(0, 0, "n0", RankState.STOPPED, signal=15)]
    outcome = decide("r1", ranks, addresses=known)
    assert outcome.root_cause.rank == 1 and "127.0.1.1" in outcome.hint
