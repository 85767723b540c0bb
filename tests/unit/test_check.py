"""`clusterrun check` without a network: the pure rules (versions, clock, interfaces, ports, disk,
shared folder), the report's table and JSON, and the host-side probe and `preflight` through the local
transport (real processes and sockets on this machine)."""

import json
import os
import socket
import sys
import textwrap

import pytest
from rich.console import Console

from clusterrun.check.doctor import ListenerSeen, Observed, evaluate, run_checks
from clusterrun.check.net_rules import connect_result, iface_result, shared_result
from clusterrun.hosts.probe import Listener, ProbeAnswer, run_probe
from clusterrun.ui.checks import render_checks
from clusterrun.check.rules import (CHECKS, CheckResult, HostReport, Report, clock_result, clock_skew, cuda_result,
                                    disagreement, disk_result, group_versions, port_text, probe_failed,
                                    python_results, shell_noise, ssh_failed, torch_results)
from clusterrun.errors import AuthError, ConnectError, HostKeyChanged, HostKeyUnknown, HostsFailed
from clusterrun.config.inventory import Host, parse_inventory
from clusterrun.launch.preflight import preflight, preflight_error
from clusterrun.transport.local import LocalTransport
from support import inventory_text, write_tree

# ------------------------------------------------------------------ versions across hosts


def test_versions_are_grouped_largest_first_and_unknown_left_out():
    groups = group_versions({"a": "3.11", "b": "3.10", "c": "3.11", "d": None})
    assert groups == [("3.11", ["a", "c"]), ("3.10", ["b"])]


def test_the_odd_host_is_named_with_what_the_others_have():
    odd, note = disagreement("Python", {"n0": "3.11", "n1": "3.11", "n2": "3.9", "n3": "3.11"})
    assert list(odd) == ["n2"]
    assert odd["n2"] == "Python 3.9 here, but 3.11 on n0, n1, n3"
    assert note == "Python differs between hosts: 3.11 on n0, n1, n3; 3.9 on n2"


def test_a_tie_has_no_majority_so_every_host_is_named():
    odd, note = disagreement("torch", {"n0": "2.13.0", "n1": "2.14.1"})
    assert odd == {"n0": "torch 2.13.0 here, but 2.14.1 on n1", "n1": "torch 2.14.1 here, but 2.13.0 on n0"}
    assert disagreement("torch", {"n0": "2.13.0", "n1": "2.13.0"}) == ({}, None)


def test_python_agreement_is_on_the_minor_version():
    facts = {"n0": {"python": "3.11.2", "executable": "/v/python"}, "n1": {"python": "3.11.9", "executable": "/p"},
             "n2": {"python": "3.10.1", "executable": "/usr/bin/python3"}}
    results, notes = python_results(facts)
    assert [results[h].status for h in ("n0", "n1", "n2")] == ["ok", "ok", "fail"]
    assert "3.10 here, but 3.11 on n0, n1" in results["n2"].detail and "/usr/bin/python3" in results["n2"].detail
    assert notes == ["Python differs between hosts: 3.11 on n0, n1; 3.10 on n2"]


def test_torch_missing_fails_that_host_and_asks_for_the_others_version():
    torch = {"n0": {"version": "2.13.0+cpu"}, "n1": {"error": "ModuleNotFoundError: No module named 'torch'"},
             "n2": {"version": "2.13.0+cpu"}}
    results, notes = torch_results(torch, {"n1": "/usr/bin/python3"})
    assert results["n1"].status == "fail"
    assert "/usr/bin/python3" in results["n1"].detail and "No module named 'torch'" in results["n1"].detail
    assert "torch 2.13.0+cpu" in results["n1"].hint
    assert results["n0"].status == results["n2"].status == "ok" and notes == []


def test_torch_release_mismatch_fails_but_a_build_or_torchvision_difference_warns():
    results, notes = torch_results({"n0": {"version": "2.13.0+cpu"}, "n1": {"version": "2.13.0+cpu"},
                                    "n2": {"version": "2.14.1+cpu"}}, {})
    assert [results[h].status for h in ("n0", "n1", "n2")] == ["ok", "ok", "fail"]
    assert "2.14.1 here, but 2.13.0 on n0, n1" in results["n2"].detail
    results, _ = torch_results({"n0": {"version": "2.13.0+cpu"}, "n1": {"version": "2.13.0+cpu"},
                                "n2": {"version": "2.13.0+cu121"}}, {})
    assert [results[h].status for h in ("n0", "n1", "n2")] == ["ok", "ok", "warn"]
    results, notes = torch_results({"n0": {"version": "2.13.0", "torchvision": "0.28.0"},
                                    "n1": {"version": "2.13.0", "torchvision": "0.28.0"}, "n2": {"version": "2.13.0"}},
                                   {})
    assert results["n2"].status == "warn" and "torchvision none here" in results["n2"].detail
    assert notes == ["torchvision differs between hosts: 0.28.0 on n0, n1; none on n2"]


def test_cuda_matters_only_for_nccl_and_must_cover_the_slots():
    cpu = {"version": "2.13.0+cpu", "cuda": False, "devices": 0, "cuda_build": None}
    assert cuda_result("gloo", 2, cpu).status == "skip"
    bad = cuda_result("nccl", 2, cpu)
    assert bad.status == "fail" and "CPU build" in bad.detail
    gpus = {"version": "2.13.0", "cuda": True, "devices": 1, "nccl": True, "nccl_version": "2.21.5",
            "cuda_build": "12.4", "device_names": ["H200"]}
    few = cuda_result("nccl", 2, gpus)
    assert few.status == "fail" and "slots: 2 but only 1 GPU" in few.detail and "slots: 1" in few.hint
    good = cuda_result("nccl", 1, gpus)
    assert good.status == "ok" and "NCCL 2.21.5" in good.detail
    assert cuda_result("nccl", 1, {**gpus, "nccl": False}).status == "fail"


# ------------------------------------------------------------------ clock, disk, port


def test_skew_is_measured_against_the_midpoint_of_the_round_trip():
    skew, err = clock_skew(sent=100.0, host_time=105.2, received=100.4)
    assert skew == pytest.approx(5.0) and err == pytest.approx(0.2)


def test_clock_thresholds_and_a_slow_round_trip_is_not_skew():
    assert clock_result(100.0, 100.05, 100.1).status == "ok"
    assert clock_result(100.0, 102.6, 100.2).status == "warn"  # 2.5 s ahead
    late = clock_result(100.0, 60.0, 100.2)
    assert late.status == "fail" and "behind" in late.detail and "Kerberos" in late.detail and "NTP" in late.hint
    # 1.5 s off the midpoint, but a 4 s round trip cannot tell that from no skew at all
    assert clock_result(100.0, 103.5, 104.0).status == "ok"


def test_disk_against_the_push_size():
    disk = {"path": "/home/cr/.clusterrun", "exists": True, "checked": "/home/cr/.clusterrun", "free": 5_000_000,
            "writable": True}
    full = disk_result(disk, 6_000_000)
    assert full.status == "fail" and "5.0 MB free" in full.detail and "6.0 MB" in full.detail
    assert disk_result(disk, 1_000_000).status == "warn"  # no room left beside it for logs and checkpoints
    assert disk_result({**disk, "free": 50 << 30}, 1_000_000).status == "ok"
    assert disk_result({**disk, "writable": False}, 10).status == "fail"
    assert disk_result({**disk, "free": 50 << 30}, None).status == "ok"  # no script: nothing to compare


def test_disk_shows_what_clusterrun_keeps_and_warns_under_10_percent():
    disk = {"path": "/w", "exists": True, "checked": "/w", "free": 50 << 30, "total": 1000 << 30, "writable": True,
            "usage": {"runs": 12, "runs_bytes": 1_200_000_000, "cache_bytes": 3_400_000_000}}
    low = disk_result(disk, 1_000_000)
    assert low.status == "warn" and "under 10% of 1.1 TB free" in low.detail
    assert "(runs: 12 using 1.2 GB, cache 3.4 GB)" in low.detail and "clusterrun clean" in low.hint
    assert disk_result({**disk, "free": 200 << 30}, 1_000_000).status == "ok"


def test_port_in_use_names_who_holds_it():
    taken = port_text({"free": False, "error": "EADDRINUSE Address already in use",
                       "holder": {"pid": 81, "command": "python3 -m http.server 29500", "user": "cr"}}, 29500, "node0")
    assert taken.status == "fail" and "29500 is in use on node0" in taken.detail
    assert "pid 81 python3 -m http.server" in taken.detail and "user cr" in taken.detail
    assert port_text({"free": True, "port": 41000}, None, "node0").detail == "auto: 41000 is free on node0"


# ------------------------------------------------------------------ network and shared folder


NET = {"master_ip": "10.0.0.10", "source": "10.0.0.11", "hostname": "n1", "hostname_addrs": ["10.0.0.11"],
       "interfaces": [{"name": "lo", "addr": "127.0.0.1", "up": True}, {"name": "eth0", "addr": "10.0.0.11", "up": True}]}
TWO = NET["interfaces"] + [{"name": "ib0", "addr": "192.168.5.11", "up": True}]


def test_one_interface_needs_no_hint():
    r = iface_result(NET, "gloo", {}, multi_host=True)
    assert (r.status, r.short, r.hint) == ("ok", "eth0", "")
    assert r.detail == "10.0.0.11 via eth0 to 10.0.0.10"


def test_several_interfaces_suggest_the_one_toward_the_master():
    gloo = iface_result({**NET, "interfaces": TWO}, "gloo", {}, multi_host=True)
    assert gloo.status == "ok" and "GLOO_SOCKET_IFNAME: eth0" in gloo.hint
    nccl = iface_result({**NET, "interfaces": TWO}, "nccl", {}, multi_host=True)
    assert nccl.status == "warn" and "NCCL_SOCKET_IFNAME: eth0" in nccl.hint


def test_a_hostname_on_loopback_breaks_gloo_across_hosts_but_not_on_one_machine():
    net = {**NET, "hostname_addrs": ["127.0.1.1"]}
    r = iface_result(net, "gloo", {}, multi_host=True)
    assert r.status == "fail" and "127.0.1.1" in r.detail and "GLOO_SOCKET_IFNAME: eth0" in r.hint
    assert iface_result(net, "gloo", {}, multi_host=False).status == "ok"
    assert iface_result(net, "gloo", {"GLOO_SOCKET_IFNAME": "eth0"}, multi_host=True).status == "ok"
    other = iface_result({**NET, "interfaces": TWO, "hostname_addrs": ["192.168.5.11"]}, "gloo", {}, True)
    assert other.status == "warn" and "ib0" in other.detail and "GLOO_SOCKET_IFNAME: eth0" in other.hint


def test_a_socket_ifname_that_does_not_exist_fails():
    r = iface_result(NET, "gloo", {"GLOO_SOCKET_IFNAME": "ens5"}, multi_host=True)
    assert r.status == "fail" and "no IPv4 interface ens5" in r.detail and "eth0" in r.hint


def test_no_route_and_a_loopback_master_fail():
    assert iface_result({**NET, "route_error": "EINVAL Invalid argument"}, "gloo", {}, True).status == "fail"
    loop = iface_result({**NET, "master_ip": "127.0.0.1", "source": "127.0.0.1"}, "gloo", {}, True)
    assert loop.status == "fail" and "loopback" in loop.detail


@pytest.mark.parametrize("connect, status, words", [
    ({"status": "ok", "ms": 0.4}, "ok", "10.0.0.10:29500 in 0.4 ms"),
    ({"status": "timeout", "seconds": 3.0}, "fail", "a firewall drops the packets"),
    ({"status": "refused"}, "fail", "refused"),
    ({"status": "unreachable", "error": "ENETUNREACH Network is unreachable"}, "fail", "no route"),
])
def test_connect_results(connect, status, words):
    r = connect_result({**NET, "connect": connect}, "10.0.0.10", 29500, "node0")
    assert r.status == status and words in r.detail


def test_a_connection_the_listener_never_saw_went_elsewhere():
    r = connect_result({**NET, "connect": {"status": "ok", "ms": 1}}, "10.0.0.10", 29500, "node0", seen=False)
    assert r.status == "warn" and "did not see" in r.detail
    skipped = connect_result(NET, "10.0.0.10", 29500, "node0", skipped="the master port is taken on node0")
    assert (skipped.status, skipped.detail) == ("skip", "the master port is taken on node0")


def test_shared_folder_results():
    ok = {"status": "ok"}
    args = dict(init_method="file", shared_dir="/tmp", rank0="node0")
    assert shared_result("env", None, "node0", is_rank0=False, written=None, read=None).status == "skip"
    assert shared_result(**args, is_rank0=True, written=ok, read=None).status == "ok"
    missing = shared_result(**args, is_rank0=False, written=ok, read={"status": "missing", "dir_exists": True})
    assert missing.status == "fail" and "/tmp is not shared with node0" in missing.detail
    assert shared_result(**args, is_rank0=False, written=ok,
                         read={"status": "ok", "dir_exists": True, "writable": True}).status == "ok"
    assert shared_result(**args, is_rank0=False, written=ok,
                         read={"status": "ok", "dir_exists": True, "writable": False}).status == "fail"
    no_write = shared_result(**args, is_rank0=True, written={"status": "error", "error": "EACCES"}, read=None)
    assert no_write.status == "fail" and "EACCES" in no_write.detail


# ------------------------------------------------------------------ ssh and the probe's failures


@pytest.mark.parametrize("exc, short, words", [
    (ConnectError("n1", "no answer from 10.0.0.11:22 within 5 s"), "unreachable", "unreachable: no answer"),
    (AuthError("n1", "no key was accepted"), "auth", "authentication failed"),
    (HostKeyUnknown("n1", "10.0.0.11 is not in kh", fingerprint="SHA256:x", hint="add it"), "key unknown",
     "policy strict refuses"),
    (HostKeyChanged("n1", "the key changed", fingerprint="SHA256:x", hint="verify"), "key changed",
     "fatal under every policy"),
])
def test_connection_errors_become_the_ssh_check(exc, short, words):
    r = ssh_failed(exc)
    assert (r.status, r.short) == ("fail", short) and words in r.detail and r.hint == exc.hint


def test_a_chatty_login_shell_and_a_missing_python():
    assert shell_noise("") is None
    noisy = shell_noise("Welcome to node1!\n")
    assert noisy.status == "fail" and "Welcome to node1!" in noisy.detail and ".bashrc" in noisy.hint
    missing = probe_failed("/usr/bin/python9", 127, "bash: line 1: /usr/bin/python9: No such file or directory\n")
    assert missing.status == "fail" and missing.short == "missing" and "/usr/bin/python9" in missing.detail


# ------------------------------------------------------------------ evaluate, table, JSON


def _inv(tmp_path, hosts=2, extra=""):
    (tmp_path / "job.py").write_text("print(1)\n")
    lines = "\n".join(f"  - {{name: n{i}, host: 10.0.0.1{i}}}" for i in range(hosts))
    text = f"version: 1\nhosts:\n{lines}\njob: {{script: job.py{extra}}}\n"
    return parse_inventory(text, str(tmp_path / "inv.yaml"))


def _facts(python="3.11.2", torch="2.13.0+cpu", source="10.0.0.11"):
    return {"python": python, "executable": "/opt/venv/bin/python",
            "disk": {"path": "/h/.clusterrun", "exists": True, "checked": "/h/.clusterrun", "free": 50 << 30,
                     "writable": True},
            "net": {**NET, "source": source, "hostname_addrs": [source],
                    "interfaces": [{"name": "eth0", "addr": source, "up": True}]},
            "torch": {"version": torch, "cuda": False, "devices": 0}}


def _observed(inv, i, facts, reach=None):
    answer = ProbeAnswer(100.0, ((100.02, {"time": 100.01}), (103.0, {"facts": facts})), "", 0, "")
    return Observed(inv.hosts[i], i, CheckResult("ssh", "ok", "connected", "", "9 ms"), answer, reach=reach)


def test_evaluate_judges_all_hosts_together(tmp_path):
    inv = _inv(tmp_path, hosts=3)
    listener = ListenerSeen({"ready": True, "pid": 1, "port": {"free": True, "port": 29500}}, "",
                            (("10.0.0.10", "n0"), ("10.0.0.11", "n1")))
    ok = {"connect": {"status": "ok", "ms": 0.3}}
    observed = [_observed(inv, 0, _facts(source="10.0.0.10"), ok), _observed(inv, 1, _facts(python="3.10.4"), ok),
                Observed(inv.hosts[2], 2, ssh_failed(ConnectError("n2", "no answer")))]
    report = evaluate(inv, observed, listener, "10.0.0.10", 29500, push_bytes=1000)
    assert [h.host for h in report.hosts] == ["n0", "n1", "n2"] and not report.ok
    n0, n1, n2 = report.hosts
    assert [r.name for r in n0.results] == list(CHECKS)
    assert n0.get("port").status == "ok" and n1.get("port").status == "skip"
    assert n0.get("python").status == n1.get("python").status == "fail"  # 1 vs 1: no majority
    assert n1.get("connect").status == "ok" and n0.get("clock").status == "ok"
    assert n2.get("ssh").status == "fail" and {r.status for r in n2.results[1:]} == {"skip"}
    assert report.notes == ("Python differs between hosts: 3.11 on n0; 3.10 on n1",)


def test_the_relay_chain_is_judged_link_by_link_and_a_broken_link_only_warns(tmp_path):
    inv = _inv(tmp_path, hosts=4)
    listener = ListenerSeen({"ready": True, "pid": 1, "port": {"free": True, "port": 29500}}, "", ())
    ok = {"status": "ok", "ms": 0.4}
    reaches = [{"relay": ok}, {"relay": {"status": "timeout", "seconds": 3}}, {"relay": ok}, {}]
    observed = [_observed(inv, i, _facts(source=f"10.0.0.1{i}"), r) for i, r in enumerate(reaches)]
    report = evaluate(inv, observed, listener, "10.0.0.10", 29500, push_bytes=1000,
                      relay_seen={1: frozenset({"n0"}), 2: frozenset(), 3: frozenset()})
    n0, n1, n2, n3 = (h.get("relay") for h in report.hosts)
    assert n0.status == "ok" and "n1 (10.0.0.11)" in n0.detail
    assert n1.status == "warn" and "cannot connect to n2 (10.0.0.12): no answer within 3 s" in n1.detail
    assert "fall back to direct pushes" in n1.detail and "push: {relay: false}" in n1.hint
    assert n2.status == "warn" and "did not see this host" in n2.detail  # connected somewhere, not to n3
    assert n3.status == "skip" and "last host" in n3.detail
    assert report.hosts[1].ok  # a warning: the push still works, directly

    off = parse_inventory("version: 1\nhosts: [{name: a, host: 10.0.0.1}, {name: b, host: 10.0.0.2}, "
                          "{name: c, host: 10.0.0.3}]\npush: {relay: false}\njob: {script: job.py}\n",
                          str(tmp_path / "inv.yaml"))
    report = evaluate(off, [_observed(off, i, _facts()) for i in range(3)], listener, "10.0.0.1", 29500, push_bytes=1)
    assert {h.get("relay").status for h in report.hosts} == {"skip"}
    assert "relay: false" in report.hosts[0].get("relay").detail


def test_a_port_in_use_skips_the_connections_and_says_why(tmp_path):
    inv = _inv(tmp_path)
    listener = ListenerSeen({"ready": True, "pid": 1, "port": {"free": False, "error": "EADDRINUSE in use"}}, "", ())
    report = evaluate(inv, [_observed(inv, 0, _facts()), _observed(inv, 1, _facts())], listener, "10.0.0.10", 29500,
                      push_bytes=None)
    assert report.hosts[0].get("port").status == "fail"
    assert report.hosts[1].get("connect").detail == "the master port could not be bound on n0"


def _report():
    good = HostReport("node0", 0, tuple(CheckResult(c, "ok", f"{c} fine", "", c) for c in CHECKS))
    bad = HostReport("node2", 2, tuple(
        CheckResult(c, "fail", "no answer from 10.0.0.10:29500 within 3 s", "allow TCP to node0", "timeout")
        if c == "connect" else CheckResult(c, "skip" if c == "shared" else "ok", f"{c} fine", "", c)
        for c in CHECKS))
    return Report((good, bad), "10.0.0.10", 29500, 2.5, ("torch differs between hosts: [x]",))


def test_the_table_has_a_row_per_host_and_the_details_of_what_failed():
    console = Console(record=True, width=200, color_system=None)
    render_checks(_report(), console)
    text = console.export_text()
    assert "MASTER_ADDR=10.0.0.10 MASTER_PORT=29500" in text
    rows = [line for line in text.splitlines() if "node0" in line or "node2" in line]
    assert "✓ ssh" in rows[0] and "✗ timeout" in rows[1]
    assert "node2 connect FAIL: no answer from 10.0.0.10:29500 within 3 s" in text
    assert "hint: allow TCP to node0" in text
    assert "note: torch differs between hosts: [x]" in text  # printed as text, not markup
    assert "1 of 2 hosts failed: node2" in text


def test_a_narrow_terminal_gets_a_line_per_host_with_its_name_whole():
    long_name = HostReport("gpu-box-rack3-node17", 1, _report().hosts[0].results)
    report = Report((_report().hosts[0], long_name, _report().hosts[1]), "10.0.0.10", 29500, 2.5)
    console = Console(record=True, width=70, color_system=None)
    render_checks(report, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 70
    assert any(line.startswith(f"gpu-box-rack3-node17  ✓ {len(CHECKS)} ok") for line in lines)  # never "gpu-b…"
    assert any(line.startswith("node2") and "✗ connect timeout" in line and f"{len(CHECKS) - 2} ok, skipped: shared" in line
               for line in lines)
    assert "node2 connect FAIL: no answer from 10.0.0.10:29500 within 3 s" in text


def _routed(ssh_status):
    route = "hostname 10.0.0.11 (ssh config ~/.ssh/config:5) user cr (inventory)"
    good = HostReport("node0", 0, tuple(CheckResult(c, "ok", "fine", "", c, {"route": route} if c == "ssh" else {})
                                        for c in CHECKS))
    other = HostReport("node1", 1, tuple(
        CheckResult(c, ssh_status if c == "ssh" else "ok", "fine", "", c, {"route": route} if c == "ssh" else {})
        for c in CHECKS))
    return Report((good, other), "10.0.0.10", 29500, 1.0)


def test_how_hosts_were_reached_is_shown_for_a_failing_host_or_with_verbose():
    def shown(report, verbose):
        console = Console(record=True, width=200, color_system=None)
        render_checks(report, console, verbose)
        return [line.split()[0] for line in console.export_text().splitlines() if " ssh hostname " in line]

    assert shown(_routed("ok"), False) == []  # every host passed: no route lines
    assert shown(_routed("ok"), True) == ["node0", "node1"]
    assert shown(_routed("fail"), False) == ["node1"]


def test_check_exits_3_only_when_every_failure_is_a_host_that_could_not_be_reached():
    def host(name, failing):
        return HostReport(name, 0, tuple(CheckResult(c, "fail" if c in failing else "ok", "", "", "") for c in CHECKS))

    ok = host("a", ())
    assert Report((ok, ok), "10.0.0.10", 29500).exit_code == 0
    assert Report((ok, host("b", ("ssh",))), "10.0.0.10", 29500).exit_code == 3  # README: connection failure
    assert Report((ok, host("b", ("torch",))), "10.0.0.10", 29500).exit_code == 1  # a check failed: not 3
    assert Report((host("a", ("port",)), host("b", ("ssh",))), "10.0.0.10", 29500).exit_code == 1


def test_json_has_every_check_of_every_host():
    data = json.loads(json.dumps(_report().to_json()))
    assert (data["ok"], data["exit_code"], data["master"]) == (False, 1, {"addr": "10.0.0.10", "port": 29500})
    assert data["checks"] == list(CHECKS)
    assert [h["host"] for h in data["hosts"]] == ["node0", "node2"]
    assert set(data["hosts"][1]["checks"]) == set(CHECKS)
    assert data["hosts"][1]["checks"]["connect"] == {"status": "fail", "detail": "no answer from 10.0.0.10:29500 "
                                                     "within 3 s", "hint": "allow TCP to node0", "data": {}}


# ------------------------------------------------------------------ the probe on this machine


def _local_host(tmp_path, name="here", python=sys.executable, **kw):
    return Host(name=name, host="localhost", addr="127.0.0.1", slots=1, connection="local", user=None, port=None,
                identity_file=None, known_hosts=None, host_key_policy="strict", python=python,
                workdir=str(tmp_path / f"work-{name}"), env={}, proxy_jump=None, source="t:1:1", **kw)


@pytest.fixture
def busy_port():
    sock = socket.socket()
    sock.bind(("", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def test_the_listener_names_who_holds_a_taken_port(tmp_path, busy_port):
    listener = Listener(LocalTransport("here"), sys.executable, {"port": busy_port, "expect": 0, "deadline": 5},
                        timeout=20)
    try:
        port = listener.ready["port"]
    finally:
        listener.finish([], wait=5)
    assert port["free"] is False and "EADDRINUSE" in port["error"]
    assert port["holder"]["pid"] == os.getpid()


def test_listener_reports_who_connected_and_removes_its_token_file(tmp_path):
    token_file = tmp_path / ".clusterrun-check-t0k"
    listener = Listener(LocalTransport("here"), sys.executable, {"port": 0, "expect": 2, "deadline": 20,
                                                                 "shared_file": str(token_file), "token": "t0k"},
                        timeout=20)
    try:
        assert listener.ready["shared"] == {"status": "ok"} and token_file.read_text() == "t0k"
        reach = run_probe(LocalTransport("other"), sys.executable, "reach",
                          {"master_addr": "127.0.0.1", "port": listener.port, "name": "other",
                           "shared_file": str(token_file), "token": "t0k"}, timeout=20).find("reach")[1]["reach"]
        assert reach["connect"]["status"] == "ok" and reach["shared"]["status"] == "ok"
    finally:
        listener.finish(["other"], wait=5)
    assert listener.peers == [("127.0.0.1", "other")]
    assert not token_file.exists()


def test_preflight_names_each_problem_and_its_host(tmp_path):
    inv = parse_inventory("version: 1\nhosts: [{name: a, host: x}, {name: b, host: y}, {name: c, host: z}]\n"
                          "master: {port: 29500}\n", str(tmp_path / "inv.yaml"))
    taken = {"free": False, "port": 29500, "error": "Address already in use (EADDRINUSE)"}
    facts = {0: {"python": "3.11.2", "executable": "/usr/bin/python3", "port": taken},
             1: {"python": "3.10.12", "executable": "/opt/py/bin/python"},
             2: {"python": "3.11.9", "executable": "/usr/bin/python3"}}
    problems = preflight(inv, facts)
    assert {(p.host, p.check, p.status) for p in problems} == {("a", "port", "fail"), ("b", "python", "fail")}
    error = preflight_error(problems)
    assert isinstance(error, HostsFailed) and sorted(error.failures) == ["a", "b"]
    assert "master port 29500 is in use on a" in str(error) and "nothing was started" in str(error)
    assert "3.10" in str(error.failures["b"])
    ok = {n: {**f, "python": "3.11.2"} for n, f in facts.items()}
    ok[0] = {**ok[0], "port": {"free": True, "port": 29500}}
    assert preflight(inv, ok) == [] and preflight_error([]) is None


FAKE_TORCH = {
    "torch/__init__.py": """
        __version__ = "2.99.0+fake"
        class version:
            cuda = None
        class cuda:
            is_available = staticmethod(lambda: False)
            device_count = staticmethod(lambda: 0)
    """,
    "torch/distributed.py": """
        is_available = lambda: True
        is_gloo_available = lambda: True
        is_nccl_available = lambda: False
    """,
}


def test_check_a_local_inventory_end_to_end(tmp_path, busy_port):
    """Two local hosts (one machine): a fake torch handed in through env:, file init in a tmp folder."""
    fake = write_tree(tmp_path / "fake", {rel: textwrap.dedent(text) for rel, text in FAKE_TORCH.items()})
    write_tree(tmp_path, {"job.py": "print(1)\n"})
    (tmp_path / "shared").mkdir()
    inv = parse_inventory(inventory_text(
        [{"name": "a", "workdir": f"{tmp_path}/wa"}, {"name": "b", "workdir": f"{tmp_path}/wb"}],
        {"script": "job.py", "init_method": "file", "shared_dir": f"{tmp_path}/shared"},
        defaults={"connection": "local", "env": {"PYTHONPATH": str(fake)}}, master={"port": "auto"},
        timeouts={"command": "20s"}), str(tmp_path / "inv.yaml"))
    report = run_checks(inv)
    assert report.ok, [(h.host, r) for h in report.hosts for r in h.results if r.status == "fail"]
    a, b = report.hosts
    assert a.get("port").status == "ok" and report.master_port == a.get("port").data["port"]
    assert a.get("torch").detail.startswith("2.99.0+fake") and b.get("connect").status == "ok"
    assert b.get("shared").detail == f"sees a's test file in {tmp_path}/shared"
    assert list((tmp_path / "shared").iterdir()) == []
    bad = parse_inventory(f"version: 1\nhosts: [{{name: a, connection: local, env: {{PYTHONPATH: '{fake}'}}}}]\n"
                          f"master: {{port: {busy_port}}}\njob: {{script: job.py}}\n", str(tmp_path / "inv2.yaml"))
    report = run_checks(bad)
    assert not report.ok and report.hosts[0].get("port").status == "fail"
    assert report.hosts[0].get("connect").status == "skip"


def test_a_master_port_held_by_a_clusterrun_run_names_that_run_and_how_to_stop_it():
    held = {"free": False, "port": 29500, "error": "Address already in use (EADDRINUSE)",
            "holder": {"uid": 1000, "user": "cr", "pid": 4242, "command": "/opt/venv/bin/python train.py",
                       "run_id": "20261201-201111-247b", "rank": 0}}
    result = port_text(held, 29500, "node0")
    assert result.detail == ("master port 29500 is in use on node0 by clusterrun run 20261201-201111-247b (rank 0; "
                             "pid 4242 /opt/venv/bin/python train.py, user cr)")
    assert "clusterrun stop 20261201-201111-247b" in result.hint and "port: auto" in result.hint
    other = port_text({**held, "holder": {"uid": 0, "user": "root"}}, 29500, "node0")
    assert other.detail == "master port 29500 is in use on node0 (user root)" and "stop what holds it" in other.hint


def test_a_master_port_a_starting_run_will_serve_is_said_so():
    claimed = {"free": False, "port": 29500, "error": "claimed by a run that is starting (EADDRINUSE once it listens)",
               "holder": {"run_id": "20261201-205527-a346", "rank": 0, "starting": True}}
    result = port_text(claimed, 29500, "node0")
    assert result.status == "fail" and result.detail == (
        "master port 29500 is in use on node0 by clusterrun run 20261201-205527-a346 (rank 0; starting: it listens "
        "there once its Python is up)")
