"""Folding through the real CLI on `connection: local` hosts (real host program, real processes, no
network): a 16-rank launch folds by default, `--no-fold` shows every rank's line, `logs --fold` folds a
recorded run, `logs --rank` and the per-rank log files stay exactly as written."""

import subprocess
import sys
import textwrap

import pytest

from support import inventory_text, write_tree

JOB = textwrap.dedent("""\
    import os, time
    rank = int(os.environ["RANK"])
    # every rank at the same moment (on a loaded machine 16 Pythons start over more than the window)
    open(os.path.join(BARRIER, str(rank)), "w").close()
    while len(os.listdir(BARRIER)) < 16:
        time.sleep(0.005)
    print("UserWarning: every rank warns [deprecated]", flush=True)
    if rank == 5:
        print("rank 5 only: cache miss", flush=True)
    time.sleep(0.5)
    print(f"rank {rank} done", flush=True)
    """)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "barrier").mkdir()
    write_tree(tmp_path, {"job.py": f"BARRIER = {str(tmp_path / 'barrier')!r}\n" + JOB, "inv.yaml": inventory_text(
        [{"name": "node1", "workdir": f"{tmp_path}/work-1"}, {"name": "node2", "workdir": f"{tmp_path}/work-2"}],
        {"script": "job.py"}, defaults={"connection": "local", "slots": 8}, master={"port": "auto"},
        timeouts={"grace": "2s", "host_lost": "10s"})})
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    return tmp_path


def cli(project, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "clusterrun", *map(str, args)], capture_output=True, text=True,
                          cwd=project, timeout=timeout)


def run_id_of(done):
    return next(line for line in done.stderr.splitlines() if line.startswith("run ")).split()[1].rstrip(":")


def test_a_16_rank_launch_folds_by_default_and_logs_keep_every_ranks_lines(project):
    done = cli(project, "launch", project / "inv.yaml")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    # one line for all 16 (they printed it within the window of each other: started together)
    warned = [line for line in out if "every rank warns" in line]
    assert "[node[1-2] r*] UserWarning: every rank warns [deprecated]" in warned, out
    assert len(warned) < 16, out  # folded (a rank started late may print its own)
    assert "[node1 r5] rank 5 only: cache miss" in out  # a line only one rank printed: shown, with its rank
    for r in range(16):  # each rank's own line: with just that rank
        assert f"[node{1 + r // 8} r{r}] rank {r} done" in out, out
    # clusterrun's own lines fold too: the ranks' ends, and the closing summary (one row per result)
    err = done.stderr.splitlines()
    ended = [line for line in err if "ended: exit code 0" in line]
    assert 1 <= len(ended) < 16 and any("r*] ended" in line or "r0-" in line for line in ended), err
    assert any("0-15 (16)" in line and "node[1-2]" in line and " ok " in line for line in err), err

    run_id = run_id_of(done)
    folded = cli(project, "logs", "--fold", run_id)
    assert folded.returncode == 0, folded.stderr
    lines = folded.stdout.splitlines()
    # side by side: every rank's first line is the warning, once; then rank 5's own and each rank's last
    assert lines[0] == "[node[1-2] r*] UserWarning: every rank warns [deprecated]", lines
    assert len(lines) == 1 + 1 + 16 and "[node1 r5] rank 5 only: cache miss" in lines, lines
    assert lines.index("[node1 r5] rank 5 only: cache miss") < lines.index("[node1 r5] rank 5 done")

    plain = cli(project, "logs", run_id).stdout.splitlines()
    assert len(plain) == 16 * 2 + 1 and "[node2 r9] UserWarning: every rank warns [deprecated]" in plain
    assert cli(project, "logs", "--rank", "5", run_id).stdout.splitlines() == [
        "[node1 r5] UserWarning: every rank warns [deprecated]", "[node1 r5] rank 5 only: cache miss",
        "[node1 r5] rank 5 done"]
    log, = (project / "home" / "runs" / run_id).rglob("rank-5.log")
    assert log.read_text() == "UserWarning: every rank warns [deprecated]\nrank 5 only: cache miss\nrank 5 done\n"


def test_no_fold_shows_every_ranks_line_as_before(project):
    done = cli(project, "launch", "--no-fold", project / "inv.yaml")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert sorted(line for line in out if "every rank warns" in line) == sorted(
        f"[node{1 + r // 8} r{r}] UserWarning: every rank warns [deprecated]" for r in range(16))
    assert not any("r*]" in line for line in out)
    err = done.stderr.splitlines()
    assert sum("ended: exit code 0" in line for line in err) == 16 and "[node2 r15] ended: exit code 0" in err
    assert any(line.startswith("│ 15 ") for line in err), err  # the summary: a row for every rank
