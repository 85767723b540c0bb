"""job.restarts end to end on this machine: two nodes (`connection: local`, one workdir each), real gloo ranks.

The job fails (rank 1 exits 7) while its attempt number (1 for the first) is at most the one given on its
command line."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support import inventory_text, write_tree

pytestmark = pytest.mark.job
torch = pytest.importorskip("torch")

CLI = [sys.executable, "-m", "clusterrun"]

JOB = textwrap.dedent("""\
    import os, sys
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["CLUSTERRUN_ATTEMPT"])
    assert os.environ["TORCHELASTIC_RESTART_COUNT"] == str(attempt - 1)  # torch counts restarts
    dist.init_process_group("gloo", init_method=os.environ["CLUSTERRUN_DIST_URL"], rank=rank, world_size=world)
    folder = os.environ["CLUSTERRUN_CHECKPOINT_DIR"]
    with open(os.path.join(folder, "seen"), "a") as fh:  # the same folder on every attempt
        fh.write(f"{attempt}\\n")
    with open("cwd-seen", "a") as fh:  # the same job folder on every attempt
        fh.write(f"{attempt} {rank}\\n")
    print(f"rank {rank} attempt {attempt} port {os.environ['MASTER_PORT']}", flush=True)
    if attempt <= int(sys.argv[-1]) and rank == 1:
        os._exit(7)
    dist.barrier()
    dist.destroy_process_group()
""")


def write_inventory(tmp_path, restarts=2, delay="0.5s"):
    write_tree(tmp_path, {"inv.yaml": inventory_text(
        [{"name": "a", "workdir": f"{tmp_path}/wa"}, {"name": "b", "workdir": f"{tmp_path}/wb"}],
        {"script": "job.py", "timeout": "60s", "restarts": restarts, "restart_delay": delay},
        defaults={"connection": "local", "env": {"OMP_NUM_THREADS": "1"}}, master={"port": "auto"}, timeouts={"grace": "2s"})})


@pytest.fixture
def project(tmp_path, cr_home):
    write_tree(tmp_path, {"job.py": JOB})
    write_inventory(tmp_path)
    return tmp_path


def launch(project, *args):
    return subprocess.run(CLI + ["launch", str(project / "inv.yaml"), *args], capture_output=True, text=True,
                          cwd=project, timeout=180)


def ps():
    return json.loads(subprocess.run(CLI + ["ps", "--json"], capture_output=True, text=True).stdout)[0]


def run_dir(project, host):
    return next((project / f"w{host}" / "runs").iterdir())


def test_a_failed_attempt_restarts_in_the_same_folders_and_succeeds(project):
    done = launch(project, "--", "1")
    assert done.returncode == 0, done.stderr
    assert "attempt 2/3 on 2 hosts in 0.5 s" in done.stderr
    assert "[a r0] rank 0 attempt 2" in done.stdout and "[b r1] rank 1 attempt 2" in done.stdout
    for host in "ab":
        folder = run_dir(project, host)
        assert (folder / "checkpoints" / "seen").read_text() == "1\n2\n"
        assert (folder / "attempt-2" / f"rank-{'ab'.index(host)}.exit").exists()
        assert sorted((folder / "job" / "cwd-seen").read_text().split("\n")[:-1]) == \
            [f"1 {'ab'.index(host)}", f"2 {'ab'.index(host)}"]
    ports = {line.split()[-1] for line in done.stdout.splitlines() if " attempt " in line and " port " in line}
    assert len(ports) == 2  # MASTER_PORT afresh for the new attempt
    record = ps()
    assert record["state"] == "succeeded" and record["attempt"] == 2 and record["restarts"] == 2
    assert [a["reason"] for a in record["attempts"]] == ["rank 1 on b: exit code 7"]
    first = subprocess.run(CLI + ["logs", "--attempt", "1"], capture_output=True, text=True)
    assert "rank 1 attempt 1" in first.stdout and "attempt 2 " not in first.stdout
    last = subprocess.run(CLI + ["logs"], capture_output=True, text=True)
    assert "rank 1 attempt 2" in last.stdout and "attempt 1 " not in last.stdout
    table = subprocess.run(CLI + ["ps"], capture_output=True, text=True).stdout
    assert "succeeded (2/3)" in table


def test_restarts_exhausted_exit_1_with_every_attempts_cause(project):
    write_inventory(project, restarts=1)
    done = launch(project, "--", "9")
    assert done.returncode == 1, done.stderr
    assert "no restart left: 2 attempts made (job.restarts: 1)" in done.stderr
    assert "Attempts (each one's first failure)" in done.stderr
    assert done.stderr.count("rank 1 on b: exit code 7") >= 3  # both rows of the table, and the reason
    record = ps()
    assert record["state"] == "failed" and record["exit_code"] == 1 and len(record["attempts"]) == 1


def test_no_restarts_means_no_attempt_table(project):
    write_inventory(project, restarts=0)
    done = launch(project, "--", "1")
    assert done.returncode == 1
    assert "Attempts" not in done.stderr and "attempt 2" not in done.stderr


def test_ctrl_c_during_the_delay_exits_130_and_restarts_nothing(project):
    write_inventory(project, restarts=2, delay="30s")
    proc = subprocess.Popen(CLI + ["launch", str(project / "inv.yaml"), "--", "1"], cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = ""
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "attempt 2/3" not in err:
            err += os.read(proc.stderr.fileno(), 4096).decode()
        assert "attempt 2/3 on 2 hosts in 30 s" in err
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=20)
        err += rest
        assert time.monotonic() - t < 5
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "before attempt 2 started" in err
    for host in "ab":
        assert not (run_dir(project, host) / "attempt-2").exists()
    record = ps()
    assert record["state"] == "interrupted" and record["exit_code"] == 130
