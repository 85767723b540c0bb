"""`clusterrun stacks` for the three ways clusterrun starts processes (python per rank, job.module,
torchrun's workers), on this machine through the real CLI: rank 1 sleeps in slow_loader() while rank 0
waits in an all_reduce; rank 1's forked child shows under it. Both readers: the bootstrap's faulthandler
(forced) and py-spy (where it is installed: the test extra)."""

import json
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from support import inventory_text, wait_for, write_tree

pytestmark = pytest.mark.job
torch = pytest.importorskip("torch")

CLI = [sys.executable, "-m", "clusterrun"]

BODY = textwrap.dedent("""\
    import multiprocessing, os, time
    import torch
    import torch.distributed as dist

    def child_work():
        time.sleep(120)

    def slow_loader():
        time.sleep(120)

    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if rank == 1:
            multiprocessing.get_context("fork").Process(target=child_work, daemon=True).start()
            print("rank 1 loading", flush=True)
            slow_loader()
        print(f"rank {rank} in all_reduce", flush=True)
        dist.all_reduce(torch.ones(1))

    if __name__ == "__main__":
        main()
    """)


def launch(tmp_path, job):
    job = {**yaml.safe_load(f"{{{job}}}"), "rank_flags": False, "sync": ["pkg/"], "timeout": "60s"}
    write_tree(tmp_path, {"stalls.py": BODY, "pkg/__init__.py": "", "pkg/stalls.py": BODY, "inv.yaml": inventory_text(
        [{"name": "here", "slots": 2, "workdir": f"{tmp_path}/work"}], job, defaults={"connection": "local", "env": {"OMP_NUM_THREADS": "1"}},
        master={"port": "auto"}, timeouts={"grace": "2s"})})
    done = subprocess.run(CLI + ["launch", "--detach", str(tmp_path / "inv.yaml")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    def placed():
        logs = subprocess.run(CLI + ["logs"], capture_output=True, text=True, timeout=60).stdout
        return "rank 1 loading" in logs and "rank 0 in all_reduce" in logs

    wait_for(placed, timeout=90, every=0.3, what="the ranks to get to their places")


def stacks(via):
    done = subprocess.run(CLI + ["stacks", "--json", "--via", via], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def main_functions(entry):
    return [f["function"] for t in entry["threads"] if t["main"] for f in t["frames"]]


@pytest.mark.parametrize("job", ["script: stalls.py", "module: pkg.stalls", "script: stalls.py, launcher: torchrun"])
def test_stacks_in_every_launch_mode(tmp_path, cr_home, job):
    launch(tmp_path, job)
    try:
        time.sleep(0.5)
        vias = ["faulthandler", "py-spy"]
        for via in vias:
            doc = stacks(via)
            by_rank = {r["rank"]: r for r in doc["ranks"]}
            assert main_functions(by_rank[1])[:3] == ["slow_loader", "main", "<module>"], (via, by_rank[1])
            assert main_functions(by_rank[0])[0] == "all_reduce", (via, by_rank[0])
            assert {r["via"] for r in doc["ranks"]} == {via}
            kids = [c for c in by_rank[1]["children"] if any(f["function"] == "child_work"
                                                             for t in c["threads"] for f in t["frames"])]
            assert len(kids) == 1, by_rank[1]["children"]  # the forked child, under its rank
        if "module" in job:
            assert any("runpy" in f["file"] for t in by_rank[1]["threads"] for f in t["frames"])  # as python -m
        text = subprocess.run(CLI + ["stacks", "--via", "faulthandler"], capture_output=True, text=True, timeout=60)
        assert "slow_loader" in text.stdout and "child process" in text.stdout, text.stdout
    finally:
        subprocess.run(CLI + ["stop", "--grace", "1"], capture_output=True, timeout=60)
