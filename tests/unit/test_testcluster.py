"""The container cluster's checked-in compose file is what `up` renders for the default cluster."""

from pathlib import Path

import testcluster
from testcluster.common import DEFAULT_HOSTS, DEFAULT_NAME, DEFAULT_SUBNET

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "compose.yaml"


def test_checked_in_compose_file_is_the_default_clusters_rendering():
    rendered = testcluster.Cluster(DEFAULT_NAME, hosts=DEFAULT_HOSTS, subnet=DEFAULT_SUBNET).compose_yaml()
    assert COMPOSE.read_text() == rendered, "docker/compose.yaml is stale: write Cluster('demo').compose_yaml() to it"


def test_compose_file_holds_nothing_of_this_machine():
    text = COMPOSE.read_text()
    assert "/work/" not in text and "/root/" not in text and "ssh-ed25519" not in text
    for variable in ("${CR_IMAGE", "${CR_AUTHORIZED_KEYS}", "${CR_STATE_DIR"):
        assert variable in text


def test_the_printed_commands_work_without_an_activated_venv(tmp_path, monkeypatch):
    import sys

    from testcluster.common import commands

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (venv / "clusterrun").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.chdir(tmp_path)
    cmd = commands()
    assert cmd["clusterrun"] == "venv/bin/clusterrun"  # beside the Python that runs testcluster, not `clusterrun`
    assert cmd["testcluster"].startswith("venv/bin/python ") and cmd["testcluster"].endswith("docker/testcluster")
    assert commands(absolute=True)["clusterrun"] == str(venv / "clusterrun")
    (venv / "clusterrun").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert commands()["clusterrun"] == "venv/bin/python -m clusterrun"


PREPARE = Path(__file__).resolve().parents[2] / "docker" / "ci-prepare.sh"


def test_ci_prepare_as_another_user_runs_itself_through_sudo_or_says_to_be_root(tmp_path):
    import shutil
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text("#!/bin/sh\necho 1000\n")  # not root
    (bin_dir / "sudo").write_text(f"#!/bin/sh\necho \"sudo $*\" > {tmp_path / 'sudo.log'}\n")
    for tool in ("id", "sudo"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(["sh", str(PREPARE)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sudo.log").read_text() == "sudo PYTHON= sh docker/ci-prepare.sh\n"
    (bin_dir / "sudo").unlink()
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))  # and no other program: no sudo on this PATH
    plain = {"PATH": str(bin_dir)}
    done = subprocess.run(["/bin/sh", str(PREPARE)], env=plain, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "run as root" in done.stderr and "no sudo" in done.stderr
