"""End to end on this machine (`connection: local`): the real CLI, real processes, real gloo ranks."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support import alive, inventory_text, poll, write_tree

pytestmark = pytest.mark.job
torch = pytest.importorskip("torch")

CLI = [sys.executable, "-m", "clusterrun"]

JOB = textwrap.dedent("""\
    import os, sys, time
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["CLUSTERRUN_DIST_URL"], rank=rank, world_size=world)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print(f"rank {rank} sum {t.item():g} argv {sys.argv[1:]}", flush=True)
    open(f"pid-{rank}", "w").write(str(os.getpid()))
    if "--fail" in sys.argv and rank == 1:
        print("rank 1 fails on purpose", flush=True)
        os._exit(5)  # sys.exit with a live gloo group can end in SIGABRT at interpreter exit (torch)
    if "--hang" in sys.argv or "--fail" in sys.argv:
        dist.barrier()  # rank 0 waits here for a rank that will never come
        time.sleep(600)
    dist.destroy_process_group()
""")


@pytest.fixture
def project(tmp_path, cr_home):
    return write_tree(tmp_path, {"job.py": JOB, "inv.yaml": inventory_text(
        [{"name": "here", "slots": 2}], {"script": "job.py", "timeout": "60s"},
        defaults={"connection": "local", "workdir": f"{tmp_path}/work", "env": {"OMP_NUM_THREADS": "1"}},
        master={"port": "auto"}, timeouts={"grace": "3s"})})


def rank_pids(project):
    run_dir = next((project / "work" / "runs").iterdir())
    return [int((run_dir / "job" / f"pid-{r}").read_text()) for r in range(2)]


def launch(project, *args, **kw):
    return subprocess.run(CLI + ["launch", str(project / "inv.yaml"), *args], capture_output=True, text=True,
                          cwd=project, timeout=120, **kw)


def test_two_ranks_all_reduce_and_succeed(project):
    done = launch(project, "--", "--a b", "$(id)")
    assert done.returncode == 0, done.stderr
    assert "[here r0] rank 0 sum 3 argv ['--rank', '0', '--world-size', '2', '--a b', '$(id)']" in done.stdout
    assert "[here r1] rank 1 sum 3" in done.stdout


def test_a_failing_rank_stops_the_other_and_exits_1(project):
    t = time.monotonic()
    done = launch(project, "--", "--fail")
    took = time.monotonic() - t
    assert done.returncode == 1, done.stderr
    assert "[here r1] rank 1 fails on purpose" in done.stdout
    assert "Root cause (first observed failure)" in done.stderr
    assert "rank 1 on here: exit code 5" in done.stderr
    assert not any(alive(p) for p in rank_pids(project))
    assert took < 30
    ps = subprocess.run(CLI + ["ps", "--json"], capture_output=True, text=True, check=True)
    (run,) = json.loads(ps.stdout)
    assert run["state"] == "failed" and run["exit_code"] == 1
    assert {r["rank"]: r["state"] for r in run["ranks"]} == {0: "stopped", 1: "failed"}


def test_ctrl_c_stops_every_rank_and_exits_130(project):
    proc = subprocess.Popen(CLI + ["launch", str(project / "inv.yaml"), "--", "--hang"], cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        runs = project / "work" / "runs"
        poll(lambda: runs.exists() and any(runs.iterdir()) and all(
            (next(runs.iterdir()) / "job" / f"pid-{r}").exists() for r in range(2)), timeout=60, every=0.2)
        pids = rank_pids(project)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not any(alive(p) for p in pids)


def test_detach_then_logs_ps_and_stop(project):
    done = launch(project, "--detach", "--", "--hang")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    deadline = time.monotonic() + 60
    logs = ""
    while time.monotonic() < deadline and "rank 1 sum 3" not in logs:
        logs = subprocess.run(CLI + ["logs", run_id[:12]], capture_output=True, text=True).stdout
        time.sleep(0.3)
    assert "[here r0] rank 0 sum 3" in logs and "[here r1] rank 1 sum 3" in logs
    assert logs.count("rank 0 sum 3") == 1
    ps = json.loads(subprocess.run(CLI + ["ps", "--json"], capture_output=True, text=True).stdout)
    assert ps[0]["id"] == run_id and ps[0]["state"] == "running"
    pids = rank_pids(project)
    stop = subprocess.run(CLI + ["stop", "latest", "--grace", "1"], capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert not any(alive(p) for p in pids)
    ps = json.loads(subprocess.run(CLI + ["ps", "--json"], capture_output=True, text=True).stdout)
    assert ps[0]["state"] == "stopped"
    again = subprocess.run(CLI + ["stop", run_id], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0


def test_dry_run_touches_nothing(project):
    done = launch(project, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "RANK=1" in done.stdout and "MASTER_PORT=auto" in done.stdout
    assert not (project / "work").exists()


def test_bad_inventory_exits_2_with_location(project):
    (project / "bad.yaml").write_text("version: 1\nhosts:\n  - {connection: local, slots: 0}\n")
    done = subprocess.run(CLI + ["launch", str(project / "bad.yaml")], capture_output=True, text=True)
    assert done.returncode == 2
    assert f"{project / 'bad.yaml'}:3:" in done.stderr and "hosts[0].slots" in done.stderr


TORCHRUN_STYLE = textwrap.dedent("""\
    import argparse, os
    import torch
    import torch.distributed as dist
    p = argparse.ArgumentParser()
    p.add_argument("total_epochs", type=int)
    p.add_argument("--batch_size", type=int, default=32)
    a = p.parse_args()
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} "
          f"node {os.environ['CLUSTERRUN_NODE_NAME']} sum {t.item():g} epochs {a.total_epochs}", flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_two_nodes_on_one_machine_run_a_torchrun_style_script(tmp_path, cr_home, launcher):
    """Two inventory entries for this one machine (people try multi-node like this), a script that
    takes its rank from the environment and has strict argparse."""
    write_tree(tmp_path, {"mn.py": TORCHRUN_STYLE, "inv.yaml": inventory_text(
        [{"name": "left", "workdir": f"{tmp_path}/left"}, {"name": "right", "workdir": f"{tmp_path}/right"}],
        {"script": "mn.py", "args": ["3", "--batch_size", "8"], "launcher": launcher, "rank_flags": False},
        defaults={"connection": "local", "slots": 2, "env": {"OMP_NUM_THREADS": "1"}},
        master={"port": "auto"}, timeouts={"grace": "3s"})})
    done = subprocess.run(CLI + ["launch", str(tmp_path / "inv.yaml")], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = {}
    for line in done.stdout.splitlines():
        if " of 4 local " in line:
            prefix, _, rest = line.partition("] ")
            host, rank = prefix.lstrip("[").split(" r")
            words = rest.split()
            assert words[1] == rank and words[7] == host and words[9] == "10" and words[11] == "3", line
            seen[int(rank)] = host
    assert sorted(seen) == [0, 1, 2, 3] and sorted(seen.values()) == ["left", "left", "right", "right"]


def test_a_torchrun_workers_traceback_leaves_no_secret_on_the_host(tmp_path, cr_home, monkeypatch):
    """Issue 21: under torchrun, workers/rank-R.result and torch's error file kept the failing worker's
    traceback unmasked. After the run, no file of the run folder (but the pushed job) holds the value."""
    write_tree(tmp_path, {
        "leak.py": "import os\nraise RuntimeError('cannot log in with ' + os.environ['API_TOKEN'])\n",
        "inv.yaml": inventory_text([{"name": "here", "slots": 1, "workdir": f"{tmp_path}/work"}],
                                   {"script": "leak.py", "launcher": "torchrun", "rank_flags": False},
                                   defaults={"connection": "local", "env": {"OMP_NUM_THREADS": "1"}}, master={"port": "auto"},
                                   secrets=["API_TOKEN"], timeouts={"grace": "3s"})})
    secret = "tok-" + os.urandom(6).hex()
    monkeypatch.setenv("API_TOKEN", secret)
    done = subprocess.run(CLI + ["launch", str(tmp_path / "inv.yaml")], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert secret not in done.stdout + done.stderr
    run_dir = next((tmp_path / "work" / "runs").iterdir())
    checked = [p for p in run_dir.rglob("*") if p.is_file() and "job" not in p.relative_to(run_dir).parts]
    assert any(p.name.endswith(".result") for p in checked)  # the worker's record is there, and was checked
    assert any("torchelastic" in p.parts for p in checked)  # so is torch's error file, under the run folder
    leaked = [str(p) for p in checked if secret.encode() in p.read_bytes()]
    assert leaked == []
    assert b"RuntimeError: cannot log in with ****" in (run_dir / "rank-0.log").read_bytes()
