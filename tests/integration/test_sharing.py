"""Shared hosts on the container cluster, with two real users: `cr` and `cr2` (a second unix user made in
every container for these tests, with its own state folder here). A run holds every slot; another
user's launch exits 5 naming it before anything is made, or with --wait takes its turn (first come,
first served: a third launch waits behind it); a run whose supervisors were SIGKILLed holds nothing;
two launches in the same second never both run; `stop` of someone else's run is refused naming them."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest

from clusterkit import CR
from support import wait_for

pytestmark = pytest.mark.integration

SECOND = "cr2"
HOSTS = 2
HOLD = ["--no-dist", "--steps", "600", "--step-time", "0.1"]  # a minute, stopped long before
QUICK = ["--no-dist", "--steps", "3", "--step-time", "0.1"]


@pytest.fixture(scope="module")
def second_user(cluster):
    """cr2 on every host: key-only login with the cluster's test key (sshd let in cr only: told again)."""
    key = Path(str(cluster.key_path) + ".pub").read_text().strip()
    script = (
        f"id {SECOND} >/dev/null 2>&1 || {{ useradd --create-home --shell /bin/bash {SECOND} && "
        f"usermod -p '*' {SECOND}; }}; "
        f"install -d -o {SECOND} -g {SECOND} -m 700 /home/{SECOND}/.ssh && "
        f"printf '%s\\n' {shlex.quote(key)} > /home/{SECOND}/.ssh/authorized_keys && "
        f"chown {SECOND}:{SECOND} /home/{SECOND}/.ssh/authorized_keys && chmod 600 /home/{SECOND}/.ssh/authorized_keys && "
        f"if ! grep -q '^AllowUsers cr {SECOND}$' /etc/ssh/sshd_config.d/clusterrun.conf; then "
        f"sed -i 's/^AllowUsers cr$/AllowUsers cr {SECOND}/' /etc/ssh/sshd_config.d/clusterrun.conf && "
        f"kill -HUP $(cat /run/sshd.pid); fi")
    for h in cluster.hosts[:HOSTS]:
        rc, out, err = cluster.exec(h, ["sh", "-c", script], user="root")
        assert rc == 0, err
    deadline = time.monotonic() + 20
    for h in cluster.hosts[:HOSTS]:
        while cluster.exec(h, ["true"], user=SECOND)[0] != 0 or _ssh_as(cluster, h, SECOND) != 0:
            assert time.monotonic() < deadline, f"{h.name}: {SECOND} cannot log in"
            time.sleep(0.3)
    yield SECOND
    for h in cluster.hosts[:HOSTS]:  # whatever a failed test left of cr2's (cr's are the guard's)
        rc, out, _ = cluster.exec(h, ["ps", "-u", SECOND, "-o", "pid=,args="], user="root")
        pids = [int(line.split()[0]) for line in out.splitlines() if line.strip() and "sshd" not in line]
        cluster.kill(h, pids)


def _ssh_as(cluster, host, user) -> int:
    argv = cluster.ssh_argv(host, "true")
    argv[argv.index("-l") + 1] = user
    import subprocess

    return subprocess.run(argv, capture_output=True, timeout=20).returncode


def user(cluster, tmp_path, name, login):
    """A clusterrun user: its own state folder here, its own login on the hosts."""
    u = CR(cluster, tmp_path / name, tmp_path / name / "home")
    (tmp_path / name).mkdir(exist_ok=True)
    u.inv = u.inventory(hosts=HOSTS, defaults={"user": login, "claims": {"slots": 1}},
                        top={"master": {"port": "auto"}})
    return u


def run_dirs(cluster, login):
    found = []
    for h in cluster.hosts[:HOSTS]:
        rc, out, _ = cluster.exec(h, ["sh", "-c", f"ls /home/{login}/.clusterrun/runs 2>/dev/null || true"],
                                  user="root")
        found += out.split()
    return found


def claims(u) -> list:
    done = u.run("ps", "--hosts", u.inv, "--json")
    assert done.returncode == 0, done.stderr
    return [e for h in json.loads(done.stdout)["hosts"].values() for e in h["entries"]]


def launch_detached(u, *args) -> str:
    done = u.run("launch", u.inv, "--detach", *args, "--", *HOLD)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def test_a_busy_host_names_its_holder_and_waiters_take_their_turns(cluster, second_user, tmp_path):
    a = user(cluster, tmp_path, "a", "cr")
    b = user(cluster, tmp_path, "b", second_user)
    c = user(cluster, tmp_path, "c", "cr")
    held = launch_detached(a)
    try:
        before = set(run_dirs(cluster, second_user))
        busy = b.run("launch", b.inv, "--", *QUICK)
        assert busy.returncode == 5, busy.stderr
        assert held in busy.stderr and "held by cr" in busy.stderr and "nothing was pushed or started" in busy.stderr
        assert set(run_dirs(cluster, second_user)) == before  # nothing was made on any host
        assert b.ps()[0]["exit_code"] == 5
        refused = b.run("stop", held, "--hosts", b.inv)
        assert refused.returncode == 2 and f"run {held}" in refused.stderr and "cr's" in refused.stderr, \
            refused.stderr

        waiting_b = b.popen("launch", b.inv, "--wait", "--", *QUICK)
        wait_for(lambda: any(e["kind"] == "queue" and e["user"] == second_user for e in claims(a)), every=0.3,
                 what="b in line")
        waiting_c = c.popen("launch", c.inv, "--wait", "--", *QUICK)
        wait_for(lambda: sum(e["kind"] == "queue" for e in claims(a)) == 2 * HOSTS, every=0.3, what="c in line")
        line = sorted((e["host"], e["position"], e["user"]) for e in claims(a) if e["kind"] == "queue")
        assert line == [(h.name, n, who) for h in cluster.hosts[:HOSTS] for n, who in ((1, second_user), (2, "cr"))]
        seen = b.run("top", b.inv, "--once", "--json", timeout=60)  # another user's view of the hosts
        assert seen.returncode == 0, seen.stderr
        for h in json.loads(seen.stdout)["hosts"]:
            assert [(e["kind"], e["user"], e["run"]) for e in h["claims"] if e["kind"] == "claim"] == \
                [("claim", "cr", held)], h
            assert sorted(e["user"] for e in h["claims"] if e["kind"] == "queue") == sorted(["cr", second_user]), h
    finally:
        stopped = a.run("stop", held)
    assert stopped.returncode == 0, stopped.stderr
    out_b, err_b = waiting_b.communicate(timeout=120)
    out_c, err_c = waiting_c.communicate(timeout=120)
    assert waiting_b.returncode == 0 and waiting_c.returncode == 0, (err_b, err_c)
    assert re.search(r"waiting \(\d+ s\): node\[0-1\]: held by cr's " + held, err_b), err_b
    assert "cr2's" in err_c, err_c  # it waited behind b (held by, or in line behind, cr2's run), not only a
    (rb,), (rc,) = b.ps()[:1], c.ps()[:1]
    assert rb["state"] == "succeeded" and rc["state"] == "succeeded"
    assert rb["ended_at"] <= min(r["started_at"] for r in rc["ranks"]) + 0.5  # c ran after b
    assert claims(a) == []


def test_a_killed_runs_claim_is_stale_and_the_next_launch_proceeds(cluster, second_user, tmp_path):
    a = user(cluster, tmp_path, "a", "cr")
    b = user(cluster, tmp_path, "b", second_user)
    held = launch_detached(a)
    holders = [e for e in claims(b) if e["run"] == held]
    assert len(holders) == HOSTS and all(e["state"] == "running" for e in holders)
    for h in cluster.hosts[:HOSTS]:  # SIGKILL the run's supervisors: nobody releases its claims
        rc, out, _ = cluster.exec(h, ["cat", f"/home/cr/.clusterrun/runs/{held}/state.json"], user="root")
        cluster.kill(h, [json.loads(out)["supervisor"]["pid"]])
    listing = claims(b)
    assert [e["live"] for e in listing if e["run"] == held] == [False] * HOSTS  # stale
    done = b.run("launch", b.inv, "--", *QUICK)
    assert done.returncode == 0, done.stderr
    # cr2 may not remove cr's files from the sticky folder: they stay, stale, until cr's next check
    assert all(not e["live"] for e in claims(b) if e["run"] == held)
    assert a.run("ps").returncode == 0  # a's registry finds its run lost and finishes it


def test_two_launches_in_the_same_second_never_both_run(cluster, second_user, tmp_path):
    a = user(cluster, tmp_path, "a", "cr")
    b = user(cluster, tmp_path, "b", second_user)
    for _ in range(3):
        procs = [u.popen("launch", u.inv, "--", *QUICK) for u in (a, b)]
        codes = sorted(p.wait(timeout=120) for p in procs)
        for p in procs:
            p.communicate()
        assert codes == [0, 5], codes  # exactly one ran; the other was told busy
        assert claims(a) == []
