"""`stop` and `logs` on recorded runs, through the real CLI on `connection: local` hosts (real host
program, real processes, no torch, no network): which run a bare `stop` picks, that an ended run's
record never changes, `logs` of a run whose host folders are gone, and `logs -f` ending like an attached
launch (summary and the run's exit code)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from support import inventory_text, poll, wait_for, write_tree

JOB = textwrap.dedent("""\
    import os, sys, time
    rank = int(os.environ["RANK"])
    print(f"rank {rank} says hello", flush=True)
    if "--sleep" in sys.argv:
        time.sleep(120)
    if "--fail" in sys.argv and rank == 1:
        time.sleep(1)  # after the hosts' supervisors have met (one that ends before it joined tells nobody)
        print("rank 1 fails on purpose", flush=True)
        sys.exit(3)
    if "--fail" in sys.argv:
        time.sleep(120)  # stopped when rank 1 fails
    """)


@pytest.fixture
def project(tmp_path, monkeypatch):
    write_tree(tmp_path, {"job.py": JOB, "inv.yaml": inventory_text(
        [{"name": "a", "workdir": f"{tmp_path}/work-a"}, {"name": "b", "workdir": f"{tmp_path}/work-b"}],
        {"script": "job.py"}, defaults={"connection": "local"}, master={"port": "auto"},
        timeouts={"grace": "2s", "host_lost": "5s"})})
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    return tmp_path


def cli(project, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "clusterrun", *map(str, args)], capture_output=True, text=True,
                          cwd=project, timeout=timeout)


def launch(project, *args, detach=False):
    done = cli(project, "launch", project / "inv.yaml", *(["--detach"] if detach else []), "--", *args)
    assert done.returncode == (0 if detach or not args or args[0] != "--fail" else 1), done.stderr
    return done.stdout.strip().splitlines()[-1] if detach else \
        next(line for line in done.stderr.splitlines() if line.startswith("run ")).split()[1].rstrip(":")


def record(project, run_id):
    runs = json.loads(cli(project, "ps", "--json", "--no-reconcile").stdout)
    return next(r for r in runs if r["id"] == run_id)


def wait_running(project, run_id):
    log = project / "home" / "runs" / run_id
    wait_for(lambda: "hello" in cli(project, "logs", run_id).stdout, timeout=20, what=f"{run_id} to say hello ({log})")


def test_stop_without_a_run_stops_the_newest_live_one_and_never_rewrites_an_ended_one(project):
    older = launch(project, "--sleep", detach=True)
    wait_running(project, older)
    ended = launch(project)  # newer, and already over
    before = record(project, ended)
    assert before["state"] == "succeeded"
    done = cli(project, "stop")
    assert done.returncode == 0, done.stderr
    assert f"run {older}: stopped" in done.stderr
    assert record(project, older)["state"] == "stopped"
    assert record(project, ended) == before  # the newest run, which had ended, was not touched

    again = cli(project, "stop", ended)
    assert again.returncode == 0, again.stderr
    assert f"run {ended} already ended (succeeded at " in again.stderr and "nothing to stop" in again.stderr
    assert record(project, ended) == before  # its record never changes: no "stopped by clusterrun stop"

    nothing = cli(project, "stop")
    assert nothing.returncode == 0 and "no run is running" in nothing.stderr and ended in nothing.stderr


def test_logs_of_a_run_whose_host_folders_are_gone_answer_from_the_local_copy_at_once(project):
    run_id = launch(project)
    for host in ("a", "b"):  # as `clean` on another machine, or retention, would leave it
        run_dir = project / f"work-{host}" / "runs" / run_id
        # the launch returns at the ranks' end; the supervisor's last write comes after
        poll(lambda run_dir=run_dir: (run_dir / "done.json").exists(), timeout=20)
        shutil.rmtree(run_dir)
    t = time.monotonic()
    done = cli(project, "logs", run_id)
    took = time.monotonic() - t
    assert done.returncode == 0, done.stderr
    assert "[a r0] rank 0 says hello" in done.stdout and "[b r1] rank 1 says hello" in done.stdout
    notes = [line for line in done.stderr.splitlines() if line.strip()]
    assert notes == [f"the hosts no longer keep run {run_id} (a, b: no such run on this host); showing the local "
                     "copy of its logs"], done.stderr
    assert "garbled" not in done.stderr
    assert took < 5, took  # was host_lost (here 5 s; 15 s by default) per host, after retries


def test_logs_follow_after_detach_ends_with_the_summary_and_the_runs_exit_code(project):
    run_id = launch(project, "--fail", detach=True)
    done = cli(project, "logs", "-f", run_id)
    assert done.returncode == 1, done.stderr  # the run's exit code, not 0
    assert "[b r1] rank 1 fails on purpose" in done.stdout
    assert "Root cause (first observed failure)" in done.stderr and "rank 1 fails on purpose" in done.stderr
    assert f"run {run_id}: failed" in done.stderr and "rank 1 on b: exit code 3" in done.stderr
    assert "stopped by clusterrun after rank 1 on b failed" in done.stderr  # rank 0: why it was stopped
    ok = launch(project, detach=True)
    followed = cli(project, "logs", "-f", ok)
    assert followed.returncode == 0 and f"run {ok}: succeeded" in followed.stderr


def test_logs_tail_must_not_be_negative(project):
    done = cli(project, "logs", "--tail", "-1")
    assert done.returncode == 2 and "--tail" in done.stderr


def test_a_launch_option_that_is_the_jobs_says_it_goes_after_the_double_dash(project):
    done = cli(project, "launch", project / "inv.yaml", "--steps", "3")
    assert done.returncode == 2
    assert "no such option: --steps" in done.stderr and "Did you mean '--help'" not in done.stderr
    assert f"arguments for the job go after `--`: clusterrun launch {project / 'inv.yaml'} -- --steps 3" in \
        " ".join(done.stderr.split())


def test_dry_run_warns_about_a_secret_this_shell_lacks(project):
    text = (project / "inv.yaml").read_text() + "secrets: [CR_TEST_TOKEN_UNSET]\n"
    (project / "inv.yaml").write_text(text)
    os.environ.pop("CR_TEST_TOKEN_UNSET", None)
    dry = cli(project, "launch", "--dry-run", project / "inv.yaml")
    assert dry.returncode == 0, dry.stderr
    assert "warning:" in dry.stderr and "CR_TEST_TOKEN_UNSET" in dry.stderr and "would refuse (exit 2)" in dry.stderr
    assert cli(project, "launch", project / "inv.yaml").returncode == 2  # what the warning announced


def test_sweep_dry_run_lists_the_points_and_touches_nothing(project):
    done = cli(project, "sweep", project / "inv.yaml", "--nodes", "1,2", "--batch-size", "8", "--out", "res",
               "--dry-run", "--", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    assert "[1/2] n1-b8-env-r0: 1 host (a), 1 rank(s), init env, job args: --epochs 1 --batch-size 8" in done.stdout
    assert "[2/2] n2-b8-env-r0: 2 hosts (a, b)" in done.stdout and "dry run" in done.stdout
    assert not (project / "res").exists() and not (project / "work-a").exists()


def test_latest_is_the_run_made_last_even_within_one_second(tmp_path):
    from clusterrun.registry.store import RunStore

    store = RunStore(str(tmp_path / "home"))
    for run_id in ("20261201-120000-ffff", "20261201-120000-0000"):  # same second: the random part sorts them
        store.create(run_id, "inv.yaml", {}, {"nodes": []}, {}, [], [])
        time.sleep(0.01)
    assert store.resolve("latest") == "20261201-120000-0000" and store.ids()[0] == "20261201-120000-0000"
    assert store.open_ids() == ["20261201-120000-0000", "20261201-120000-ffff"]
