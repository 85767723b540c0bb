"""Open files (hosts/fds.py): the plan (pure), and through the real CLI on `connection: local` hosts, a
launch under a soft limit too low for its hosts raises it and succeeds, one under a hard limit too low is
refused before any host is touched, naming the hard limit."""

import os
import resource
import subprocess
import sys
import time

import pytest

from clusterrun.errors import EXIT_USAGE, FdLimitTooLow
from clusterrun.hosts.fds import FdPlan, ensure_fds, fds_needed, plan_limit
from clusterrun.transport.waiting import ready
from support import inventory_text, write_tree

INF = resource.RLIM_INFINITY


def test_the_estimate_grows_with_hosts_and_ranks():
    assert fds_needed(128, 128) > fds_needed(64, 64) > fds_needed(1, 1) > 0
    assert fds_needed(128, 1024) > 1024  # 128 hosts of 8 GPUs: past Linux's usual soft limit


def test_the_plan_raises_the_soft_limit_up_to_the_hard_one_and_never_lowers_it():
    assert plan_limit(900, soft=1024, hard=4096, infinity=INF) == FdPlan(None)  # enough already
    assert plan_limit(2000, soft=1024, hard=4096, infinity=INF) == FdPlan(2000)
    assert plan_limit(2000, soft=1024, hard=INF, infinity=INF) == FdPlan(2000)
    assert plan_limit(2000, soft=INF, hard=INF, infinity=INF) == FdPlan(None)
    assert plan_limit(5000, soft=1024, hard=4096, infinity=INF) == FdPlan(None, too_low=True)


def test_the_error_names_the_hard_limit_and_how_to_raise_it():
    text = str(FdLimitTooLow(512, 4096, 7232, 4096, "big.yaml"))
    assert text.startswith("big.yaml: 512 hosts (4096 ranks) need about 7232 open files")
    assert "at most 4096 (the hard limit, `ulimit -Hn`)" in text and "limits.conf" in text
    assert FdLimitTooLow(1, 1, 1, 1).exit_code == EXIT_USAGE


def test_ensure_fds_raises_this_process_soft_limit(monkeypatch):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = fds_needed(40, 40)
    if hard != INF and hard < want:
        pytest.skip(f"hard limit {hard} here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want - 10, hard))
    try:
        assert ensure_fds(40, 40)[0] == want == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert ensure_fds(1, 1)[0] == want  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_waiting_uses_poll_so_descriptors_past_1023_work():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != INF and hard < 1100:
        pytest.skip(f"hard limit {hard} here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    r, w = os.pipe()
    high = os.dup2(r, 1050)  # select() refuses this one (FD_SETSIZE is 1024)
    try:
        assert not ready(high, 0.01)
        os.write(w, b"x")
        assert ready(high, 1.0) and ready(w, 0, write=True)
    finally:
        for fd in (r, w, high):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


HOSTS = 12


@pytest.fixture
def project(tmp_path, monkeypatch):
    write_tree(tmp_path, {"job.py": "import time\ntime.sleep(1)\nprint('done', flush=True)\n",
                          "inv.yaml": inventory_text([{"name": f"h{i}", "workdir": f"{tmp_path}/w{i}"}
                                                      for i in range(HOSTS)], {"script": "job.py"},
                                                     defaults={"connection": "local"}, master={"port": "auto"})})
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    return tmp_path


def launch_under(project, soft, hard):
    """`launch` with these limits; (its result, the most files it had open at once)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.Popen([sys.executable, "-m", "clusterrun", "launch", "inv.yaml"], cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, len(os.listdir(f"/proc/{proc.pid}/fd")))
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, err, peak


def test_a_launch_raises_a_soft_limit_too_low_for_its_hosts_and_stays_within_its_estimate(project):
    code, err, peak = launch_under(project, 40, fds_needed(HOSTS, HOSTS) + 50)
    assert code == 0, err
    assert 40 < peak <= fds_needed(HOSTS, HOSTS), peak  # it needed more than 40, and no more than estimated


def test_a_hard_limit_too_low_is_refused_before_any_host_is_touched(project):
    hard = fds_needed(HOSTS, HOSTS) - 1
    code, err, _ = launch_under(project, 40, hard)
    assert code == EXIT_USAGE, err
    assert f"inv.yaml: {HOSTS} hosts ({HOSTS} ranks) need about {hard + 1} open files" in err
    assert f"at most {hard} (the hard limit, `ulimit -Hn`)" in err
    assert not any((project / f"w{i}").exists() for i in range(HOSTS))
