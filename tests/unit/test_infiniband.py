"""InfiniBand/RoCE in `check`: the devices read from a sysfs tree (/sys/class/infiniband's layout), and the
notes: which hosts have active ports, and a warning where the run would use TCP beside them."""

from types import SimpleNamespace

from clusterrun.check.net_rules import active_ib, ib_notes
from clusterrun.hosts.probe import PROBE_SOURCE


def probe_module():
    """remote/probe.py as check feeds it to a host, its sources in front."""
    import types

    module = types.ModuleType("probe")
    exec(compile(PROBE_SOURCE.decode(), "probe.py", "exec"), module.__dict__)
    return module


def sysfs(tmp_path, ports):
    root = tmp_path / "infiniband"
    for device, port, state, layer in ports:
        folder = root / device / "ports" / port
        folder.mkdir(parents=True)
        (folder / "state").write_text(state + "\n")
        (folder / "link_layer").write_text(layer + "\n")
        (folder / "rate").write_text("200 Gb/sec (4X HDR)\n")
    return root


def test_the_probe_reads_devices_and_ports(tmp_path):
    root = sysfs(tmp_path, [("mlx5_0", "1", "4: ACTIVE", "InfiniBand"), ("mlx5_1", "1", "1: DOWN", "Ethernet")])
    ib = probe_module().ib_facts(str(root))
    assert ib == [{"device": "mlx5_0", "ports": [{"state": "4: ACTIVE", "link_layer": "InfiniBand",
                                                  "rate": "200 Gb/sec (4X HDR)", "port": "1"}]},
                  {"device": "mlx5_1", "ports": [{"state": "1: DOWN", "link_layer": "Ethernet",
                                                  "rate": "200 Gb/sec (4X HDR)", "port": "1"}]}]
    assert active_ib(ib) == ["mlx5_0 port 1 (InfiniBand, 200 Gb/sec (4X HDR))"]
    assert probe_module().ib_facts(str(tmp_path / "none")) == []


def test_notes_warn_where_the_run_would_use_tcp_beside_infiniband(tmp_path):
    ib = probe_module().ib_facts(str(sysfs(tmp_path, [("mlx5_0", "1", "4: ACTIVE", "InfiniBand")])))
    facts = {"node0": {"ib": ib}, "node1": {"ib": ib}, "node2": {"ib": []}}
    hosts = [SimpleNamespace(name=n, env={}) for n in facts]
    gloo = ib_notes(facts, "gloo", hosts)
    assert gloo == ["InfiniBand/RoCE on node0: mlx5_0 port 1 (InfiniBand, 200 Gb/sec (4X HDR)); node1: mlx5_0 port 1 "
                    "(InfiniBand, 200 Gb/sec (4X HDR)), but backend gloo always talks TCP: backend: nccl uses them "
                    "(NCCL_IB_HCA picks the devices)"]
    hosts[1] = SimpleNamespace(name="node1", env={"NCCL_IB_DISABLE": "1"})
    assert "NCCL_IB_DISABLE is set in the env of node1: NCCL falls back to TCP there" in ib_notes(facts, "nccl", hosts)[0]
    hosts[1] = SimpleNamespace(name="node1", env={})
    assert "NCCL should use them; NCCL_DEBUG=INFO shows `NET/IB : Using`" in ib_notes(facts, "nccl", hosts)[0]
    assert ib_notes({"node2": {"ib": []}}, "gloo", hosts) == []
