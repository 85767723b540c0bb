"""Folding on the container cluster over real SSH: 4 hosts x 4 ranks, every rank prints the same warning
at the same moment and one rank a line of its own; the launch shows the warning once with `r*`, the odd
line with its rank, and every rank's log stays exactly as written (`logs --rank`, `logs --fold`)."""

import re
import textwrap
import time

import pytest

from support import write_tree

pytestmark = pytest.mark.integration

JOB = textwrap.dedent("""\
    import os, sys, time
    rank = int(os.environ["RANK"])
    at = float(sys.argv[sys.argv.index("--at") + 1])
    time.sleep(max(0.0, at - time.time()))  # the hosts share this machine's clock: every rank at once
    print("UserWarning: torch.distributed: every rank says this", flush=True)
    if rank == 6:
        print("rank 6 alone: shard 6 is missing, using a fallback", flush=True)
    time.sleep(0.3)
    print(f"rank {rank} finished", flush=True)
    """)
WARNING = "UserWarning: torch.distributed: every rank says this"


def ranks_of(line):
    """The ranks a folded line names: `[node[0,3] r0-3,12-15] ...` → [0, 1, 2, 3, 12, ...]; `r*`: all 16."""
    spec = re.match(r"\[\S+ r([\d,*-]+)\] ", line).group(1)
    if spec == "*":
        return list(range(16))
    return [r for part in spec.split(",") for r in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]


def test_sixteen_ranks_fold_the_common_warning_and_keep_the_odd_line(cr, tmp_path):
    root = write_tree(tmp_path / "project", {"fold_job.py": JOB})
    inv = cr.inventory(job={"root": str(root), "script": "fold_job.py"}, defaults={"slots": 4})
    done = cr.run("launch", inv, "--", "--at", f"{time.time() + 8:.3f}")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    # 16 lines as one (`[node[0-3] r*]`); the ranks print within ~50 ms of each other, but on this loaded
    # machine a host's lines can come later than the window: then a few lines, each naming its ranks
    sets = [ranks_of(line) for line in out if line.endswith(f"] {WARNING}")]
    assert sorted(r for s in sets for r in s) == list(range(16)) and len(sets) <= 4, out
    assert "[node1 r6] rank 6 alone: shard 6 is missing, using a fallback" in out, out
    assert sorted(line for line in out if line.endswith(" finished")) == sorted(
        f"[node{r // 4} r{r}] rank {r} finished" for r in range(16))

    (run,) = cr.ps()
    assert cr.run("logs", "--rank", "6", run["id"]).stdout.splitlines() == [
        f"[node1 r6] {WARNING}", "[node1 r6] rank 6 alone: shard 6 is missing, using a fallback",
        "[node1 r6] rank 6 finished"]
    plain = cr.run("logs", run["id"]).stdout.splitlines()
    assert sum(WARNING in line for line in plain) == 16  # the recorded logs: as every rank wrote them
    folded = cr.run("logs", "--fold", run["id"]).stdout.splitlines()
    assert folded[0] == f"[node[0-3] r*] {WARNING}" and len(folded) == 1 + 1 + 16, folded

    unfolded = cr.run("launch", "--no-fold", inv, "--", "--at", f"{time.time() + 8:.3f}")
    assert unfolded.returncode == 0, unfolded.stderr[-3000:]
    assert sorted(line for line in unfolded.stdout.splitlines() if WARNING in line) == sorted(
        f"[node{r // 4} r{r}] {WARNING}" for r in range(16))
