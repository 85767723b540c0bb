"""A rank's DataLoader with worker processes runs through clusterrun's bootstrap as it runs without it,
and its workers' stacks can be read (each forked worker dumps into a file of its own)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from clusterrun.remote.host.observe import stacks as host_stacks
from clusterrun.remote.host.run.bootstrap import __file__ as BOOTSTRAP

pytestmark = pytest.mark.job
pytest.importorskip("torch")

JOB = textwrap.dedent("""\
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if "--stall" in sys.argv and i == 40:
                print("ready", flush=True)
                time.sleep(120)  # a slow sample: its worker sits here
            return torch.tensor([float(i * i)])

    if __name__ == "__main__":
        total = sum(float(b.sum()) for b in DataLoader(Squares(), batch_size=8, num_workers=2))
        print("total", total, flush=True)
    """)


def test_a_dataloader_with_workers_runs_the_same(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(JOB)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    boot = subprocess.run([sys.executable, BOOTSTRAP, str(tmp_path / "rank-0"), "0", str(script)],
                          capture_output=True, text=True, timeout=300)
    assert plain.returncode == boot.returncode == 0, boot.stderr
    assert plain.stdout == boot.stdout == f"total {float(sum(i * i for i in range(64)))}\n"


def test_a_stuck_workers_stack_is_read_from_its_own_file(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(JOB)
    stacks = tmp_path / "rank-0"
    proc = subprocess.Popen([sys.executable, BOOTSTRAP, str(stacks), "0", str(script), "--stall"],
                            stdout=subprocess.PIPE, text=True)
    workers = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        workers = host_stacks.descendants(proc.pid, host_stacks.process_table())
        assert len(workers) >= 2, workers
        time.sleep(0.5)
        got = host_stacks.faulthandler_dumps([(w, f"{stacks}.{w}") for w in workers], time.time() + 5)
        stuck = [w for w, (threads, _) in got.items()
                 if any(f["function"] == "__getitem__" for t in threads for f in t["frames"])]
        assert len(stuck) == 1, got
        assert all(os.path.exists(f"{stacks}.{w}") for w in workers)
    finally:
        for w in workers:  # our own children's children, by pid
            try:
                os.kill(w, 9)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()
