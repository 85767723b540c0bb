"""The GPU preflight on the container cluster: a stand-in nvidia-smi on every host's PATH (canned `-q -x`
output of real A100s, tests/standin/gpu) and a stand-in torch for the CUDA op (through the hosts' env:
PYTHONPATH), each host's mode set through a file. `check` and `launch` over real SSH: healthy passes,
ECC errors and an unreadable field fail naming host and GPU, a hanging nvidia-smi is cut at its deadline
and fails, a driver that differs on one host is named, and launch skips a failing GPU where `gpus:`
allows it, else exits 6 before anything is pushed."""

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

HOSTS = ["node0", "node1", "node2", "node3"]
STANDIN = Path(__file__).resolve().parents[1] / "standin" / "gpu"
FOLDER = "/opt/standin"  # on each host; its nvidia-smi linked from /usr/local/bin


@pytest.fixture(scope="module")
def gpus(cluster):
    """Install the stand-ins on every host for this module (and remove them after: other modules' hosts
    have no nvidia-smi); gpus(host, words) sets one host's mode ("" healthy)."""
    files = [p for p in STANDIN.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for host in HOSTS:
        for p in files:
            target = f"{FOLDER}/{p.relative_to(STANDIN)}"
            rc, _, err = cluster.exec(host, ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod 0755 "$1"',
                                             "sh", target], user="root", input=p.read_text())
            assert rc == 0, err
        cluster.exec(host, ["ln", "-sf", f"{FOLDER}/nvidia-smi", "/usr/local/bin/nvidia-smi"], user="root")

    def mode(host, words=""):
        rc, _, err = cluster.exec(host, ["sh", "-c", f"cat > {FOLDER}/mode && chmod 0644 {FOLDER}/mode"],
                                  user="root", input=words)
        assert rc == 0, err
    for host in HOSTS:
        mode(host)
    yield mode
    for host in HOSTS:
        cluster.exec(host, ["rm", "-rf", FOLDER, "/usr/local/bin/nvidia-smi"], user="root")


@pytest.fixture
def healthy(gpus):
    for host in HOSTS:
        gpus(host)
    yield gpus
    for host in HOSTS:
        gpus(host)


def gpu_inventory(cr, gpus_key=(0, 1), slots=1, **kw):
    return cr.inventory(defaults={"gpus": list(gpus_key) if isinstance(gpus_key, tuple) else gpus_key,
                                  "slots": slots, "env": {"PYTHONPATH": FOLDER}},
                        job={"script": "gpus.py"}, **kw)


def check(cr, inv, *extra):
    done = cr.run("check", inv, "--json", *extra, timeout=120)
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    return done.returncode, report, {h["host"]: h["checks"]["gpu"] for h in report["hosts"]}


def test_check_passes_healthy_gpus_and_measures_each(cr, healthy):
    code, report, gpu = check(cr, gpu_inventory(cr))
    assert code == 0, [(h["host"], n, c["detail"]) for h in report["hosts"] for n, c in h["checks"].items()
                       if c["status"] == "fail"]
    for host in HOSTS:
        assert gpu[host]["status"] == "ok" and gpu[host]["detail"].startswith("2 GPUs, driver 535.129.03, CUDA 12.2"), \
            gpu[host]["detail"]
        assert [g["tflops"] > 0 for g in gpu[host]["data"]["gpus"]] == [True, True]
    print("\n" + gpu["node0"]["detail"])


def test_check_fails_closed_naming_host_and_gpu(cr, healthy):
    healthy("node1", "ecc")
    healthy("node2", "unreadable")
    healthy("node3", "hang")
    t0 = time.monotonic()
    code, report, gpu = check(cr, gpu_inventory(cr))
    seconds = time.monotonic() - t0
    assert code == 1 and {h: g["status"] for h, g in gpu.items()} == {
        "node0": "ok", "node1": "fail", "node2": "fail", "node3": "fail"}
    assert gpu["node1"]["detail"].startswith("node1 GPU 1: 2 uncorrectable ECC errors since the driver loaded")
    assert "row remapping pending" in gpu["node1"]["detail"] and "reset" in gpu["node1"]["hint"]
    assert gpu["node2"]["detail"].startswith(
        "node2 GPU 1: volatile ECC counter dram_uncorrectable unreadable ('[Unknown Error]')")
    assert gpu["node3"]["detail"].startswith("node3: nvidia-smi did not finish within 5 s")
    assert "node3 GPU 0: unchecked" in gpu["node3"]["detail"]
    assert seconds < 60  # the hang was cut at its deadline (timeouts.command 20 s: nvidia-smi gets 5 s)
    print("\n" + "\n".join(f"{h}: {g['detail']}" for h, g in gpu.items()))


def test_check_names_the_host_whose_driver_differs(cr, healthy):
    healthy("node3", "driver=550.54.15")
    code, report, gpu = check(cr, gpu_inventory(cr))
    assert code == 1 and [h for h, g in gpu.items() if g["status"] == "fail"] == ["node3"]
    assert gpu["node3"]["detail"].startswith("node3: NVIDIA driver 550.54.15 here, but 535.129.03 on node0, node1, node2")
    assert "NVIDIA driver differs between hosts: 535.129.03 on node0, node1, node2; 550.54.15 on node3" in report["notes"]


def test_check_without_the_gpu_check(cr, healthy):
    healthy("node3", "hang")
    code, _, gpu = check(cr, gpu_inventory(cr), "--no-gpu-check")
    assert code == 0 and {g["status"] for g in gpu.values()} == {"skip"}


def ranks_gpus(stdout):
    """{rank: its CUDA_VISIBLE_DEVICES} from the ranks' lines `[node1 r1] {...}`."""
    out = {}
    for line in stdout.splitlines():
        if "{" in line:
            d = json.loads(line[line.index("{"):])
            out[d["rank"]] = d["gpus"]
    return out


def test_launch_skips_a_failing_gpu_that_gpus_auto_can_avoid(cr, healthy):
    healthy("node1", "ecc")  # GPU 1 has uncorrectable errors; one rank per host needs one GPU
    done = cr.run("launch", gpu_inventory(cr, "auto"), timeout=150)
    assert done.returncode == 0, done.stderr
    assert "GPU preflight: node1 GPU 1 skipped: 2 uncorrectable ECC errors" in done.stderr
    assert "the run uses GPUs 0 there" in done.stderr
    assert ranks_gpus(done.stdout)[1] == "0"  # node1's rank got the healthy GPU
    print("\n" + "\n".join(line for line in done.stderr.splitlines() if "GPU preflight" in line))


def test_launch_exits_6_before_pushing_when_gpus_leaves_no_other(cr, cluster, healthy):
    healthy("node2", "unreadable")  # GPU 1 cannot be read, and node2 must use GPUs 0 and 1
    before = {h: set(cr.run_dirs(h)) for h in HOSTS}
    done = cr.run("launch", gpu_inventory(cr, (0, 1), slots=2), timeout=150)
    assert done.returncode == 6, (done.stdout, done.stderr)
    assert "GPU preflight failed on 1 host; nothing was started" in done.stderr
    assert "node2 GPU 1: volatile ECC counter dram_uncorrectable unreadable" in done.stderr
    assert "only 1 healthy GPU (0) for 2 ranks" in done.stderr
    assert {h: set(cr.run_dirs(h)) - before[h] for h in HOSTS} == {h: set() for h in HOSTS}  # nothing pushed
    print("\n" + done.stderr)


def test_launch_with_a_hanging_nvidia_smi_fails_and_no_gpu_check_skips(cr, healthy):
    healthy("node3", "hang")
    inv = gpu_inventory(cr)
    done = cr.run("launch", inv, timeout=150)
    assert done.returncode == 6 and "node3: nvidia-smi did not finish within 5 s" in done.stderr, done.stderr
    healthy("node3", "nodriver")  # (a hanging one would hold the claim's own GPU query too)
    done = cr.run("launch", inv, "--no-gpu-check", timeout=150)
    assert done.returncode == 0, done.stderr
    assert ranks_gpus(done.stdout) == {0: "0", 1: "0", 2: "0", 3: "0"}


# ------------------------------------------------------------------ leftovers

DEVICES = "/tmp/standin-dev/nvidia*"  # stand-in device files: what the leftovers check treats as /dev/nvidia*
HOLD = "python3 -c 'import sys, time; f = open(sys.argv[1]); print(\"up\", flush=True); time.sleep(300)' {dev}"


def node1_inventory(cr, name, **job):
    def only_node1(hosts):
        hosts[:] = [h for h in hosts if h["name"] == "node1"]
    return cr.inventory(name, defaults={"gpu_devices": DEVICES, "env": {"STANDIN_DEVICE": "/tmp/standin-dev/nvidia0",
                                                                        "PYTHONPATH": FOLDER}},
                        job={"script": "leftover.py", **job}, edit_hosts=only_node1)


def holders(cr, target, *extra):
    done = cr.run("clean", "--leftovers", target, "--json", *extra, timeout=60)
    assert done.returncode == 0, done.stderr
    return {x["pid"]: x for x in json.loads(done.stdout)["leftovers"]}


@pytest.fixture
def devices(cluster):
    cluster.exec("node1", ["sh", "-c", "mkdir -p /tmp/standin-dev && : > /tmp/standin-dev/nvidia0"])
    yield
    cluster.exec("node1", ["rm", "-rf", "/tmp/standin-dev"])


def test_a_leftover_of_a_crashed_run_is_named_and_clean_kills_only_it(cr, cluster, ssh, healthy, devices):
    unknown = ssh("node1").spawn(HOLD.format(dev="/tmp/standin-dev/nvidia0"))  # not clusterrun's: left alone
    assert unknown.readline(timeout=20).strip() == "up"
    inv = node1_inventory(cr, "leftover.yaml")
    done = cr.run("launch", inv, "--detach", timeout=120)
    assert done.returncode == 0, done.stderr
    run = done.stdout.strip().splitlines()[-1].split()[-1]
    found = {}

    def child_holds():
        found.update(holders(cr, str(inv), "--dry-run"))
        return any(x["label"] == "live-run" and x["run"] == run for x in found.values())
    deadline = time.monotonic() + 30
    while not child_holds():
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
    leftover = next(pid for pid, x in found.items() if x["run"] == run)
    assert found[unknown.pid]["label"] == "unknown" and found[leftover]["gpus"] == [0]
    # the supervisor dies (a crash): its rank dies with it, the child that left the group stays
    rc, out, _ = cluster.exec("node1", ["cat", f".clusterrun/runs/{run}/state.json"])
    cluster.exec("node1", ["kill", "-KILL", str(json.loads(out)["supervisor"]["pid"])])
    deadline = time.monotonic() + 30
    while holders(cr, str(inv), "--dry-run").get(leftover, {}).get("label") != "ended-run":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    # ps --hosts lists the holders on hosts whose runs use GPUs
    ps_inv = cr.inventory("ps.yaml", defaults={"gpus": [0], "gpu_devices": DEVICES})
    shown = cr.run("ps", "--hosts", ps_inv, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"node1 GPU 0: held by pid {leftover} (" in shown.stdout and f"left by ended run {run}" in shown.stdout
    # the next launch's GPU preflight names it, with the fix
    gpu_inv = cr.inventory("gpus.yaml", defaults={"gpus": [0], "gpu_devices": DEVICES, "env": {"PYTHONPATH": FOLDER}},
                           job={"script": "gpus.py"}, edit_hosts=lambda hs: hs.__setitem__(
                               slice(None), [h for h in hs if h["name"] == "node1"]))
    done = cr.run("launch", gpu_inv, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "GPU preflight: node1 GPU 0: held by pid " in done.stderr and f"held by pid {leftover} (" in done.stderr
    assert f"left by ended run {run}: `clusterrun clean --leftovers {run}` ends it" in done.stderr
    assert f"held by pid {unknown.pid} (" in done.stderr and "not a clusterrun run's" in done.stderr
    print("\n" + "\n".join(line for line in done.stderr.splitlines() if "held by" in line))
    # clean --leftovers RUN: exactly that run's marked process
    after = holders(cr, run)
    assert [pid for pid, x in after.items() if x["killed"]] == [leftover]
    assert not after[unknown.pid]["killed"]
    left = holders(cr, str(inv), "--dry-run")
    assert leftover not in left and unknown.pid in left
    shown = cr.run("clean", "--leftovers", str(inv), "--dry-run", timeout=60)
    print(shown.stderr)


def test_the_supervisors_teardown_ends_a_child_that_left_its_rank(cr, healthy, devices):
    inv = node1_inventory(cr, "exit.yaml", args=["--exit"])
    done = cr.run("launch", inv, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split("left pid ")[1].split()[0])
    assert pid not in holders(cr, str(inv), "--dry-run")  # gone with its run: nothing left holding the GPU
