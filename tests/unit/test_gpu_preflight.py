"""The GPU preflight: nvidia-smi's report parsed (canned `-q -x` output of real A100s, tests/standin/gpu),
the pure rules fail closed, the hosts compared, the host side run for real with the stand-in nvidia-smi
and a stand-in torch, `check`'s gpu column end to end, and launch's gate (skip a GPU, or exit 6)."""

import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from clusterrun.check.doctor import run_checks
from clusterrun.check.gpu_rules import (FATAL_XIDS, HostGpus, GpuVerdict, gpu_request, gpu_result, judge_host,
                                        judge_peers, short_bus, unreadable, usable)
from clusterrun.config.inventory import parse_inventory
from clusterrun.errors import EXIT_GPU, CommandTimeout, GpuCheckFailed, HostsFailed
from clusterrun.events import Notice
from clusterrun.launch.gpu_gate import GpuGate
from clusterrun.plan import build_plan
from clusterrun.remote.host.share import gpu_health
from support import inventory_text, write_tree

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "gpu"


def canned(name):
    return (STANDIN / f"{name}.xml").read_text()


def answer(xml="healthy", op=None, xid=None):
    """A gpu-check answer as the host sends it, from a canned report."""
    smi = gpu_health.parse_smi_xml(canned(xml)) if isinstance(xml, str) else xml
    ok = {"results": [{"index": i, "ok": True, "tflops": 200.0} for i in (0, 1)], "timeout": 30.0}
    return {"smi": smi, "xid": xid or {"readable": True, "events": []}, "op": ok if op is None else op}


# ------------------------------------------------------------------ nvidia-smi -q -x


def test_the_healthy_report_is_read_field_by_field():
    smi = gpu_health.parse_smi_xml(canned("healthy"))
    assert (smi["driver"], smi["cuda"], len(smi["gpus"])) == ("535.129.03", "12.2", 2)
    g = smi["gpus"][1]
    assert g["index"] == 1 and g["bus_id"] == "00000000:0F:00.0" and g["name"] == "NVIDIA A100-SXM4-80GB"
    assert (g["persistence"], g["temp"], g["temp_slow"], g["ecc_mode"]) == ("Enabled", "33 C", "89 C", "Enabled")
    assert g["volatile"] == {"sram_uncorrectable": "0", "dram_uncorrectable": "0"} == g["aggregate"]
    assert (g["retired_pending"], g["remap_pending"], g["remap_failure"]) == ("N/A", "No", "No")
    assert g["throttle"]["gpu_idle"] == "Active" and g["throttle"]["hw_slowdown"] == "Not Active"


def test_an_older_drivers_report_double_bit_counters_and_throttle_reasons():
    xml = """<nvidia_smi_log><driver_version>470.103.01</driver_version><cuda_version>11.4</cuda_version>
    <gpu id="00000000:D8:00.0"><product_name>Tesla V100-PCIE-32GB</product_name>
    <persistence_mode>Enabled</persistence_mode><pci><pci_bus_id>00000000:D8:00.0</pci_bus_id></pci>
    <clocks_throttle_reasons><clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown>
    </clocks_throttle_reasons><ecc_mode><current_ecc>Enabled</current_ecc></ecc_mode>
    <ecc_errors><volatile><single_bit><total>4</total></single_bit><double_bit><device_memory>1</device_memory>
    <total>1</total></double_bit></volatile><aggregate><double_bit><total>3</total></double_bit></aggregate>
    </ecc_errors><retired_pages><pending_blacklist>No</pending_blacklist></retired_pages>
    <temperature><gpu_temp>40 C</gpu_temp><gpu_temp_slow_threshold>84 C</gpu_temp_slow_threshold></temperature>
    </gpu></nvidia_smi_log>"""
    g = gpu_health.parse_smi_xml(xml)["gpus"][0]
    assert g["volatile"] == {"double_bit.total": "1"} and g["aggregate"] == {"double_bit.total": "3"}
    assert g["retired_pending"] == "No" and g["throttle"] == {"hw_slowdown": "Active"}
    v = judge_host("old", "auto", answer(gpu_health.parse_smi_xml(xml), op={"results": [
        {"index": 0, "ok": True, "tflops": 14.0}]})).gpus[0]
    assert v.failures == ("1 uncorrectable ECC error since the driver loaded (volatile double_bit.total)",)
    assert "3 uncorrectable ECC errors in its lifetime (aggregate double_bit.total)" in v.warnings
    assert "clocks throttled (hw_slowdown)" in v.warnings


def test_output_that_is_not_the_report_is_an_error():
    for text, words in (("NVIDIA-SMI has failed", "no readable XML"), ("<html/>", "not <nvidia_smi_log>")):
        with pytest.raises(ValueError, match=words):
            gpu_health.parse_smi_xml(text)


# ------------------------------------------------------------------ the rules, one host


def test_healthy_gpus_pass_with_their_driver_and_throughput():
    h = judge_host("node0", "auto", answer())
    assert h.status == "ok" and [g.index for g in h.gpus] == [0, 1] and (h.driver, h.cuda) == ("535.129.03", "12.2")
    r = gpu_result(h)
    assert r.status == "ok" and r.detail == "2 GPUs, driver 535.129.03, CUDA 12.2, matmul 200-200 TFLOPS"


def test_uncorrectable_ecc_and_a_pending_remap_fail_that_gpu_only():
    h = judge_host("node1", [0, 1], answer("ecc"))
    assert [g.status for g in h.gpus] == ["ok", "fail"]
    assert h.gpus[1].failures == ("2 uncorrectable ECC errors since the driver loaded (volatile dram_uncorrectable)",
                                  "row remapping pending (takes effect on a reset)")
    r = gpu_result(h)
    assert r.status == "fail" and r.detail.startswith("node1 GPU 1: 2 uncorrectable ECC errors") and "reset" in r.hint


def test_an_unreadable_value_fails_closed():
    h = judge_host("node2", "auto", answer("unreadable"))
    assert h.status == "fail"
    assert h.gpus[1].failures == ("volatile ECC counter dram_uncorrectable unreadable ('[Unknown Error]')",)
    assert h.failing() == ["node2 GPU 1: volatile ECC counter dram_uncorrectable unreadable ('[Unknown Error]')"]
    smi = gpu_health.parse_smi_xml(canned("healthy"))
    for field, value in (("temp", "[GPU requires reset]"), ("temp", None), ("ecc_mode", "[Unknown Error]"),
                         ("persistence", "ERR!")):
        broken = dict(smi, gpus=[dict(smi["gpus"][0], **{field: value})])
        assert judge_host("n", [0], answer(broken)).gpus[0].status == "fail", (field, value)
    assert unreadable("[Unknown Error]") and not unreadable("N/A") and not unreadable("[N/A]") and unreadable(None)


def test_no_ecc_on_the_board_is_not_a_failure():
    smi = gpu_health.parse_smi_xml(canned("healthy"))
    geforce = dict(smi, gpus=[dict(smi["gpus"][0], ecc_mode="N/A", volatile={}, aggregate={}, retired_pending="N/A",
                                   remap_pending="N/A", remap_failure="N/A", persistence="Disabled")])
    v = judge_host("desk", [0], answer(geforce)).gpus[0]
    assert v.status == "warn" and v.failures == () and "persistence mode off" in v.warnings[0]


def test_nvidia_smi_that_hung_or_failed_fails_every_gpu_by_name():
    h = judge_host("node3", [0, 1], {"smi": {"error": "nvidia-smi did not finish within 10 s"}, "xid": {}})
    assert h.status == "fail" and h.failures == ("nvidia-smi did not finish within 10 s",)
    assert [g.text() for g in h.gpus] == ["node3 GPU 0: unchecked: nvidia-smi did not finish within 10 s",
                                          "node3 GPU 1: unchecked: nvidia-smi did not finish within 10 s"]
    assert usable(h, "auto", 1) is None  # nothing can be trusted there: no GPU to fall back on
    assert judge_host("n", "auto", answer({"driver": "535", "cuda": "12.2", "gpus": []})).failures == (
        "nvidia-smi reports no GPU",)


def test_a_gpu_the_inventory_names_but_the_host_lacks_fails():
    h = judge_host("node0", [0, 5], answer())
    assert h.gpus[1].failures == ("nvidia-smi reports no GPU 5 (it has 0, 1)",)


def test_the_cuda_op_failing_hanging_or_not_running_fails_closed():
    failed = {"results": [{"index": 0, "ok": True, "tflops": 9.0},
                          {"index": 1, "ok": False, "error": "RuntimeError: CUDA error: uncorrectable ECC error"}]}
    assert judge_host("n", "auto", answer(op=failed)).gpus[1].failures == (
        "CUDA op failed: RuntimeError: CUDA error: uncorrectable ECC error",)
    hung = {"results": [{"index": 0, "ok": True, "tflops": 9.0}], "timed_out": True, "timeout": 30.0,
            "error": "the CUDA op did not finish within 30 s"}
    assert judge_host("n", "auto", answer(op=hung)).gpus[1].failures == (
        "CUDA op did not finish within 30 s (hung on this GPU or one before it)",)
    none = {"results": [], "error": "torch 2.13.0+cpu sees no CUDA device (torch.cuda.is_available() is False)"}
    assert [g.failures for g in judge_host("n", "auto", answer(op=none)).gpus] == [
        ("CUDA op did not run: torch 2.13.0+cpu sees no CUDA device (torch.cuda.is_available() is False)",)] * 2


def test_xids_in_the_kernel_log_are_matched_to_the_gpu_by_bus_id():
    log = ("[  12.3] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03\n"
           "[ 812.0] NVRM: Xid (PCI:0000:0f:00): 79, pid=2231, name=python, GPU has fallen off the bus.\n"
           "[ 900.1] NVRM: Xid (PCI:0000:07:00): 13, pid=1, name=python, Graphics Exception\n")
    events = gpu_health.parse_xids(log)
    assert events[0] == {"bus_id": "0000:0f:00", "xid": 79, "text": "pid=2231, name=python, GPU has fallen off the bus."}
    h = judge_host("node1", "auto", answer(xid={"readable": True, "events": events}))
    assert h.gpus[1].failures == ("Xid 79 in the kernel log (last: Xid 79, pid=2231, name=python, GPU has fallen "
                                  "off the bus.)",)
    assert h.gpus[0].status == "warn" and h.gpus[0].warnings[0].startswith("Xid 13 in the kernel log")
    assert 79 in FATAL_XIDS and 13 not in FATAL_XIDS and short_bus("00000000:0F:00.0") == short_bus("0000:0f:00")
    unread = judge_host("n", "auto", answer(xid={"readable": False, "error": "/dev/kmsg: Operation not permitted"}))
    assert unread.status == "ok" and unread.notes == (
        "Xid not checked: the kernel log is not readable (/dev/kmsg: Operation not permitted)",)


def test_the_kernel_log_is_read_to_its_end(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,1,2,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=9, An uncorrectable double bit error\n")
    facts = gpu_health.xid_facts(str(log))
    assert facts["readable"] and facts["events"][0]["xid"] == 48
    assert gpu_health.xid_facts(str(tmp_path / "none"))["readable"] is False


def test_a_throttled_or_hot_gpu_warns():
    smi = gpu_health.parse_smi_xml(canned("healthy"))
    hot = dict(smi["gpus"][0], temp="90 C", throttle=dict(smi["gpus"][0]["throttle"], hw_thermal_slowdown="Active"))
    v = judge_host("n", [0], answer(dict(smi, gpus=[hot]))).gpus[0]
    assert v.status == "warn" and v.warnings == ("90 C at or past its slowdown threshold (89 C)",
                                                 "clocks throttled (hw_thermal_slowdown)")


# ------------------------------------------------------------------ the hosts together


def test_a_driver_that_differs_on_one_host_fails_that_host_and_is_noted():
    other = gpu_health.parse_smi_xml(canned("healthy"))
    hosts = {h: judge_host(h, "auto", answer()) for h in ("node0", "node1", "node2")}
    hosts["node3"] = judge_host("node3", "auto", answer(dict(other, driver="550.54.15")))
    judged, notes = judge_peers(hosts)
    assert [h for h, v in judged.items() if v.status == "fail"] == ["node3"]
    assert judged["node3"].failures == ("NVIDIA driver 550.54.15 here, but 535.129.03 on node0, node1, node2",)
    assert notes == ["NVIDIA driver differs between hosts: 535.129.03 on node0, node1, node2; 550.54.15 on node3"]


def test_a_gpu_under_half_its_peers_median_is_flagged():
    slow = {"results": [{"index": 0, "ok": True, "tflops": 200.0}, {"index": 1, "ok": True, "tflops": 60.0}]}
    judged, _ = judge_peers({"a": judge_host("a", "auto", answer()), "b": judge_host("b", "auto", answer(op=slow))})
    assert judged["a"].status == "ok" and judged["b"].gpus[0].status == "ok"
    assert judged["b"].gpus[1].warnings == ("slow: 60 TFLOPS, under half the other GPUs' median (200)",)


def test_a_failing_gpu_is_avoided_only_where_gpus_leaves_enough_others():
    h = judge_host("node1", "auto", answer("ecc"))
    assert usable(h, "auto", 1) == (0,) and usable(h, "auto", 2) is None
    assert usable(judge_host("node1", [0, 1], answer("ecc")), [0, 1], 2) is None
    assert usable(judge_host("node1", "auto", answer()), "auto", 1) is None  # nothing to avoid


def test_requests_only_where_the_run_uses_gpus_and_the_check_is_on(tmp_path):
    inv = parse_inventory(inventory_text([{"name": "a", "host": "10.0.0.1", "gpus": [0, 1]},
                                          {"name": "b", "host": "10.0.0.2"},
                                          {"name": "c", "host": "10.0.0.3", "gpus": "auto", "gpu_check": False}],
                                         {"script": "job.py"}), str(tmp_path / "inv.yaml"))
    a, b, c = inv.hosts
    req = gpu_request(a, 60.0)
    assert req["gpus"] == [0, 1] and req["python"] == a.python and req["smi_timeout"] == 10.0
    assert req["op_timeout"] == 30.0 and gpu_request(b, 60.0) is None and gpu_request(c, 60.0) is None


# ------------------------------------------------------------------ the host side, for real


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A copy of the stand-ins (nvidia-smi first on PATH; torch for PYTHONPATH), with its mode file:
    standin(words) chooses what they do; standin.dir is the folder."""
    folder = tmp_path / "standin"
    shutil.copytree(STANDIN, folder)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    def mode(words):
        (folder / "mode").write_text(words)
    mode.dir = folder
    return mode


def host_check(folder, **request):
    return gpu_health.check({"gpus": "auto", "python": sys.executable, "env": {"PYTHONPATH": str(folder)},
                             "kmsg": "/nonexistent/kmsg", **request})


def test_host_side_healthy_gpus_run_the_cuda_op(standin):
    got = host_check(standin.dir)
    assert [r["index"] for r in got["op"]["results"]] == [0, 1] and all(r["ok"] for r in got["op"]["results"])
    assert judge_host("here", "auto", got).status == "ok"


def test_host_side_a_hanging_nvidia_smi_is_cut_at_its_deadline(standin):
    import time

    standin("hang")
    t0 = time.monotonic()
    got = host_check(standin.dir, gpus=[0], smi_timeout=1.0, op_timeout=5.0)
    assert time.monotonic() - t0 < 5.0 and got["smi"] == {"error": "nvidia-smi did not finish within 1 s"}
    assert judge_host("here", [0], got).failing()[0] == "here: nvidia-smi did not finish within 1 s"


def test_host_side_no_driver_and_cuda_ops_that_fail_or_hang(standin):
    standin("nodriver")
    assert host_check(standin.dir)["smi"]["error"].startswith("nvidia-smi -q -x failed (exit 9): NVIDIA-SMI has failed")
    standin("op-fail=1")
    got = judge_host("here", "auto", host_check(standin.dir))
    assert got.gpus[1].failures == ("CUDA op failed: RuntimeError: CUDA error: uncorrectable ECC error encountered",)
    standin("op-hang=1")
    got = host_check(standin.dir, op_timeout=3.0)
    assert [r["index"] for r in got["op"]["results"]] == [0] and got["op"]["timed_out"]
    assert judge_host("here", "auto", got).gpus[1].failures == (
        "CUDA op did not finish within 3 s (hung on this GPU or one before it)",)


def test_host_side_a_python_without_cuda_fails_closed(standin):
    """This machine's own torch (a CPU build, or none at all): the op cannot run, and that is a failure."""
    got = gpu_health.check({"gpus": [0], "python": sys.executable, "env": {}, "kmsg": "/nonexistent"})
    assert not got["op"]["results"] and ("sees no CUDA device" in got["op"]["error"] or
                                         "import torch failed" in got["op"]["error"])
    assert judge_host("here", [0], got).gpus[0].failures[0].startswith("CUDA op did not run: ")


def test_check_shows_the_gpu_column_end_to_end(tmp_path, standin):
    write_tree(tmp_path, {"job.py": "print(1)\n"})
    inv = parse_inventory(inventory_text(
        [{"name": "a", "workdir": f"{tmp_path}/wa", "gpus": [0, 1]}, {"name": "b", "workdir": f"{tmp_path}/wb"}],
        {"script": "job.py"}, defaults={"connection": "local", "env": {"PYTHONPATH": str(standin.dir)}},
        master={"port": "auto"}, timeouts={"command": "30s"}), str(tmp_path / "inv.yaml"))
    standin("ecc")
    report = run_checks(inv)
    a, b = report.hosts
    assert a.get("gpu").status == "fail" and a.get("gpu").detail.startswith("a GPU 1: 2 uncorrectable ECC errors")
    assert b.get("gpu").status == "skip" and report.exit_code == 1
    assert a.get("gpu").data["gpus"][0]["status"] == "ok"
    from clusterrun.cli.common import without_gpu_check

    skipped = run_checks(without_gpu_check(inv))
    assert skipped.hosts[0].get("gpu").detail == "skipped (gpu_check: false, or --no-gpu-check)"


# ------------------------------------------------------------------ launch's gate


def gate_setup(tmp_path, gpus, slots=1):
    write_tree(tmp_path, {"job.py": "print(1)\n"})
    inv = parse_inventory(inventory_text([{"name": "a", "host": "10.0.0.1", "gpus": gpus, "slots": slots},
                                          {"name": "b", "host": "10.0.0.2", "gpus": "auto"},
                                          {"name": "c", "host": "10.0.0.3"}], {"script": "job.py"}),
                          str(tmp_path / "inv.yaml"))
    plan = build_plan(inv, "20261202-120000-abcd")
    posted = []
    return GpuGate(inv, plan.nodes, posted.append), plan.nodes, posted


def run_gate(gate, nodes, answers):
    """Every node through the gate at once, as the launch's prepare threads go: {name: result or error}."""
    out = {}

    def one(node):
        try:
            if gate.wants(node.index):
                got = answers[node.host.name]
                out[node.host.name] = gate.check(node, lambda req, t: got() if callable(got) else got)
            else:
                gate.wait()
                out[node.host.name] = "waited"
        except Exception as exc:  # what the prepare thread would raise
            out[node.host.name] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_gate_skips_a_failing_gpu_where_gpus_has_another_and_says_so(tmp_path):
    gate, nodes, posted = gate_setup(tmp_path, "auto")
    out = run_gate(gate, nodes, {"a": answer("ecc"), "b": answer()})
    assert out == {"a": (0,), "b": None, "c": "waited"} and not gate.blocked
    texts = [p.text for p in posted if isinstance(p, Notice)]
    assert any(t.startswith("GPU preflight: a GPU 1 skipped: 2 uncorrectable ECC errors") and
               t.endswith("the run uses GPUs 0 there") for t in texts)
    assert "GPU preflight: b: 2 GPUs, driver 535.129.03, CUDA 12.2, matmul 200-200 TFLOPS" in texts


def test_gate_refuses_when_gpus_leaves_no_other_and_every_host_stops(tmp_path):
    gate, nodes, _ = gate_setup(tmp_path, [0, 1], slots=2)
    out = run_gate(gate, nodes, {"a": answer("unreadable"), "b": answer()})
    assert isinstance(out["a"], GpuCheckFailed) and out["a"].exit_code == EXIT_GPU == 6
    assert "a GPU 1: volatile ECC counter dram_uncorrectable unreadable" in str(out["a"])
    assert "only 1 healthy GPU (0) for 2 ranks" in out["a"].hint
    assert out["b"] is None and gate.blocked  # b passed, but pushes nothing: a refused
    assert HostsFailed("GPU preflight", {"a": out["a"]}).exit_code == EXIT_GPU


def test_gate_fails_closed_on_a_host_that_gave_no_answer(tmp_path):
    gate, nodes, _ = gate_setup(tmp_path, "auto")

    def silent():
        raise CommandTimeout("b", "no answer within 50 s")

    out = run_gate(gate, nodes, {"a": answer(), "b": silent})
    assert isinstance(out["b"], GpuCheckFailed) and "gpu-check gave no answer" in str(out["b"])
    assert out["a"] is None and gate.blocked


def test_host_verdict_texts_name_host_and_gpu():
    h = HostGpus("n", (GpuVerdict("n", 3, failures=("x",)), GpuVerdict("n", 4, warnings=("y",))), ("z",))
    assert h.failing() == ["n: z", "n GPU 3: x"] and h.warned() == ["n GPU 4: y"] and h.status == "fail"
