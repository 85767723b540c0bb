"""job.environment on the container cluster, whose hosts reach no package index: hand-written wheels (one
with a dependency) installed on every host through `wheels: controller`; the venv used as it is on a
relaunch (no installer ran); a changed requirements file builds a new one; a killed installer's build
is never used; the stack fingerprint refuses a host with another torch (exit 2, naming it and both
versions) unless allow_mismatch accepts it. One cluster for the module (the session's)."""

import base64
import json
import textwrap
import time

import pytest

from support import wait_for, write_tree, write_wheel

pytestmark = pytest.mark.integration

WORK = "/home/cr/.clusterrun"
BASE = "/usr/bin/python3"  # Debian's, with python3-venv; the hosts' /opt/venv has torch 2.13.0+cpu
JOB = textwrap.dedent("""\
    import argparse, sys
    p = argparse.ArgumentParser(); p.add_argument("--rank"); p.add_argument("--world-size"); a = p.parse_args()
    import tinypkg
    print("rank", a.rank, "python", sys.executable, "tinypkg", tinypkg.__version__, tinypkg.dep(), flush=True)
""")
TORCH_JOB = textwrap.dedent("""\
    import argparse, torch
    p = argparse.ArgumentParser(); p.add_argument("--rank"); p.add_argument("--world-size"); a = p.parse_args()
    print("rank", a.rank, "torch", torch.__version__, flush=True)
""")


def host_sh(cluster, host, script):
    rc, out, err = cluster.exec(host, ["sh", "-c", script])
    assert rc == 0, err
    return out


def envs_on(cluster, host):
    """The finished venvs on a host, and any build folder left there."""
    return host_sh(cluster, host, f"ls -A {WORK}/envs 2>/dev/null | grep -v '[.]lock$' || true").split()


@pytest.fixture
def clean_envs(cluster):
    """Every host's venvs go after the test: the next test (or session) builds its own."""
    yield
    for h in cluster.hosts:
        cluster.exec(h, ["sh", "-c", f"rm -rf {WORK}/envs {WORK}/fingerprints /home/cr/standin"])


@pytest.fixture
def project(tmp_path):
    write_wheel(tmp_path / "wheels", "tinydep", "1.0", "def dep():\n    return 'dep 1.0'\n")
    write_wheel(tmp_path / "wheels", "tinypkg", "0.3", "from tinydep import dep\n", requires=("tinydep==1.0",))
    # the wheels folder is the controller's own (a private package's, say): --find-links is honoured where
    # the download happens; the hosts never see it, only what the push carries
    return write_tree(tmp_path / "job", {"job.py": JOB, "requirements.txt": f"--find-links {tmp_path}/wheels\n"
                                                                             "tinypkg==0.3\n"})


def env_inventory(cr, root, hosts=3, **environment):
    return cr.inventory(hosts=hosts, job={"root": str(root), "script": "job.py", "environment": {
        "requirements": "requirements.txt", "python": BASE, **environment}})


def test_controller_wheels_build_once_are_reused_with_no_installer_and_rebuilt_when_changed(
        cr, cluster, project, clean_envs):
    inv = env_inventory(cr, project, wheels="controller")
    first = cr.run("launch", inv)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "wheels: 2 file(s) for cp311-" in first.stderr and "(downloaded here with pip)" in first.stderr
    assert "built on node0, node1, node2 in" in first.stderr and "(pip)" in first.stderr
    key = envs_on(cluster, "node0")
    assert len(key) == 1 and all(envs_on(cluster, h) == key for h in ("node1", "node2"))
    for rank in range(3):
        assert f"rank {rank} python {WORK}/envs/{key[0]}/bin/python tinypkg 0.3 dep 1.0" in first.stdout
    marker = f"{WORK}/envs/{key[0]}/clusterrun-env.json"
    built_at = json.loads(host_sh(cluster, "node1", f"cat {marker}"))["built_at"]
    run1 = cr.ps()[0]
    assert {h["stack"]["environment"]["built"] for h in run1["hosts"]} == {True}

    second = cr.run("launch", inv)
    assert second.returncode == 0, second.stderr
    assert "node0, node1, node2 had it" in second.stderr and "(downloaded before)" in second.stderr
    assert "[node1 env]" not in second.stdout  # no step of a build was reported ...
    run2 = cr.ps()[0]
    for h in ("node0", "node1", "node2"):  # ... and none ran: a build writes the run's environment.log
        assert host_sh(cluster, h, f"ls {WORK}/runs/{run2['id']}").split().count("environment.log") == 0
    assert json.loads(host_sh(cluster, "node1", f"cat {marker}"))["built_at"] == built_at
    assert {h["stack"]["environment"]["built"] for h in run2["hosts"]} == {False}
    assert "rank 2 python" in second.stdout

    (project / "requirements.txt").write_text((project / "requirements.txt").read_text() + "tinydep==1.0\n")
    third = cr.run("launch", inv)
    assert third.returncode == 0, third.stderr
    assert "built on node0, node1, node2" in third.stderr
    assert len(envs_on(cluster, "node2")) == 2  # a new env beside the old one


def test_a_killed_installer_leaves_no_env_and_a_dead_build_is_swept_by_the_next(cr, cluster, project, clean_envs):
    inv = env_inventory(cr, project, hosts=2, wheels="controller")
    host_sh(cluster, "node0", f"mkdir -p {WORK}/envs/.build-0123456789abcdef-99/bin")  # a build that died
    launch = cr.popen("launch", inv)

    def installer():
        out = host_sh(cluster, "node1", "ps -u cr -o pid=,args= | grep '[p]ip install' || true").split()
        return out[0] if out else None

    pid = wait_for(installer, timeout=60, every=0.05, what="pip install running on node1")
    host_sh(cluster, "node1", f"kill -9 {pid}")
    out, err = launch.communicate(timeout=120)
    assert launch.returncode == 1, err
    assert "node1: environment build failed: installing the requirements: python exited by signal SIGKILL" in err
    assert envs_on(cluster, "node1") == []  # neither the env nor its build folder
    assert cr.ps()[0]["id"] not in cr.run_dirs("node1")  # nothing half-done: the unstarted run went too

    again = cr.run("launch", inv)
    assert again.returncode == 0, again.stderr
    assert "built on node1" in again.stderr
    assert ".build-0123456789abcdef-99" in envs_on(cluster, "node0")  # another key's: left to its own build
    assert all(not n.startswith(".build-") for n in envs_on(cluster, "node1"))


def test_another_torch_on_one_host_refuses_the_launch_unless_allowed(cr, cluster, tmp_path, clean_envs):
    for i, h in enumerate(cluster.hosts[:3]):  # a stand-in torch: node2's has another version
        version = "2.14.1" if i == 2 else "2.13.0"
        wheel = write_wheel(tmp_path / f"standin{i}", "torch", version)
        rc, _, err = cluster.exec(h, ["sh", "-c", f"mkdir -p /home/cr/standin && base64 -d > /home/cr/standin/{wheel.name}"],
                                  input=base64.b64encode(wheel.read_bytes()).decode())
        assert rc == 0, err
    root = write_tree(tmp_path / "job", {"job.py": TORCH_JOB,
                                         "requirements.txt": "--no-index\n--find-links /home/cr/standin\ntorch\n"})
    t0 = time.time()
    refused = cr.run("launch", env_inventory(cr, root, wheels="index"))
    assert refused.returncode == 2, refused.stderr
    assert "the hosts' stacks differ; nothing was started" in refused.stderr
    assert "node2: torch 2.14.1, the others 2.13.0" in refused.stderr
    assert "allow_mismatch: [torch]" in refused.stderr
    assert "rank 0 torch" not in refused.stdout and time.time() - t0 < 120
    stacks = {h["name"]: h["stack"]["fingerprint"]["torch"] for h in cr.ps()[0]["hosts"]}
    assert stacks == {"node0": "2.13.0", "node1": "2.13.0", "node2": "2.14.1"}  # the record keeps them

    allowed = cr.run("launch", env_inventory(cr, root, wheels="index", allow_mismatch=["torch"]))
    assert allowed.returncode == 0, allowed.stderr
    assert "rank 2 torch 2.14.1" in allowed.stdout and "rank 0 torch 2.13.0" in allowed.stdout


def test_a_plain_python_with_another_torch_is_refused_before_any_rank_starts(cr, cluster, clean_envs):
    def other_python(hosts):
        hosts[1]["python"] = BASE  # no torch there; the others' /opt/venv has 2.13.0+cpu

    done = cr.run("launch", cr.inventory(hosts=3, job={"args": ["--no-dist"]}, edit_hosts=other_python))
    assert done.returncode == 2, done.stderr
    assert "node1: torch none, the others 2.13.0+cpu" in done.stderr
    assert "[node0 r0]" not in done.stdout
