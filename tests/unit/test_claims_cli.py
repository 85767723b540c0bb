"""The commands around claims, through the CLI and the real host program on `connection: local` hosts:
`ps --hosts` lists every entry (any user's, in line order), `stop` refuses a run someone else launched,
naming them, and the launch's busy exit is 5 with the holder's table."""

import json
import os
import sys
import time

from clusterrun.cli import run as cli
from clusterrun.registry.store import RunStore
from clusterrun.remote.host.procs import start_ticks
from clusterrun.remote.host.share.claims import Claims
from support import inventory_text, write_tree


def inventory(tmp_path, slots=1):
    """Two "hosts" on this machine, each with a claims folder of its own (as two machines have)."""
    write_tree(tmp_path, {"job.py": "print('hi')\n", "inv.yaml": inventory_text(
        [{"name": f"here{i}", "workdir": str(tmp_path / f"w{i}"), "claims": {"dir": str(tmp_path / f"claims{i}"),
                                                                           "slots": slots}} for i in range(2)],
        {"script": "job.py"}, defaults={"connection": "local", "python": sys.executable},
        timeouts={"command": "20s"})})
    return tmp_path / "inv.yaml", str(tmp_path / "claims0")


def hold(folder, run, node="here0", state="running", ticket=None, kind="claim"):
    c = Claims({"dir": folder, "run": run, "node": node, "by": "bob@laptop-b", "slots": 1,
                "ticket": [ticket or time.time(), run]})
    if kind == "claim":
        c.admit()
        c.set_claim(state, pid=os.getpid(), ticks=start_ticks(os.getpid()))
    else:
        c.enqueue()
    return c


def test_ps_hosts_lists_every_entry_in_line_order(tmp_path, cr_home, capsys):
    inv, folder = inventory(tmp_path)
    os.mkdir(folder, 0o700)  # the host program makes it 1777 at its first claim; here a test does
    os.chmod(folder, 0o1777)
    hold(folder, "20261201-100000-aaaa")
    hold(folder, "20261201-100100-cccc", kind="queue", ticket=20.0)
    hold(folder, "20261201-100200-bbbb", kind="queue", ticket=10.0)
    assert cli(["ps", "--hosts", str(inv), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["hosts"]) == ["here0", "here1"]
    entries = data["hosts"]["here0"]["entries"]
    line = sorted((e["position"], e["run"]) for e in entries if e["kind"] == "queue")
    assert line == [(1, "20261201-100200-bbbb"), (2, "20261201-100100-cccc")]
    (claim,) = [e for e in entries if e["kind"] == "claim"]
    assert (claim["state"], claim["by"], claim["live"]) == ("running", "bob@laptop-b", True)
    assert cli(["ps", "--hosts", str(inv)]) == 0
    text = capsys.readouterr().out
    assert "waiting #1" in text and "waiting #2" in text and "bob@laptop-b" in text


def test_stop_refuses_a_run_only_the_hosts_know_naming_its_owner(tmp_path, cr_home, capsys):
    inv, folder = inventory(tmp_path)
    hold(folder, "20261201-100000-aaaa")
    assert cli(["stop", "20261201-100000", "--hosts", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "run 20261201-100000-aaaa on here0 is" in err and "launched by bob@laptop-b" in err


def test_stop_refuses_a_run_someone_else_launched_in_a_shared_registry(tmp_path, cr_home, capsys):
    store = RunStore()
    store.create("20261201-100000-dddd", "inv.yaml", {"timeouts": {}}, {"nodes": []},
                 {"host": "laptop-b", "pid": 1, "ticks": 1, "user": "bob-not-me"}, [], [])
    assert cli(["stop", "20261201-100000-dddd"]) == 2
    err = capsys.readouterr().err
    assert "launched by bob-not-me (on laptop-b)" in err and "ask bob-not-me" in err


def test_a_busy_launch_exits_5_with_the_holders_table(tmp_path, cr_home, capsys, monkeypatch):
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    inv, folder = inventory(tmp_path)
    hold(str(tmp_path / "claims1"), "20261201-100000-aaaa", node="here1")
    assert cli(["launch", str(inv)]) == 5
    err = capsys.readouterr().err
    assert "hosts busy: 1 host held by other runs; nothing was pushed or started" in err
    assert "push: 0 hosts" not in err  # a phase no host finished says nothing before the busy table
    assert "here1: busy: held by" in err and "20261201-100000-aaaa" in err and "bob@laptop-b" in err
    # the arithmetic: what the run needs, what the host offers, and who holds the rest (issue 36)
    who = __import__("pwd").getpwuid(os.getuid()).pw_name  # the host names the login user itself
    assert f"(needs 1 slot; here1 offers 1, of which {who}'s run 20261201-100000-aaaa holds 1)" in \
        " ".join(err.split()), err
    assert not any((tmp_path / w / "runs").exists() and os.listdir(tmp_path / w / "runs") for w in ("w0", "w1"))
    (run,) = RunStore().ids()
    assert RunStore().get(run).exit_code == 5


def test_ps_hosts_on_free_hosts_says_so_instead_of_an_empty_table(tmp_path, cr_home, capsys):
    inv, _ = inventory(tmp_path)
    assert cli(["ps", "--hosts", str(inv)]) == 0
    text = capsys.readouterr().out
    assert "no claims and nobody waiting on 2 hosts" in text and "free: here[0-1]" in text, text
    assert "┏" not in text  # no table without a row


def test_logs_follow_of_a_queued_run_waits_in_line_then_follows_it(tmp_path, cr_home, monkeypatch):
    """`logs -f` of a `--detach --wait` run still in line exited 1 at once ("the hosts no longer keep run
    ... the run was not started"); it waits, saying where the run stands, then follows it, with its exit
    code (issue 36)."""
    import subprocess
    import threading

    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    inv, folder = inventory(tmp_path)
    holder = hold(folder, "20261201-100000-aaaa")  # here0 is busy
    cmd = [sys.executable, "-m", "clusterrun"]
    queued = subprocess.run(cmd + ["launch", "--detach", "--wait", str(inv)], capture_output=True, text=True,
                            timeout=120)
    assert queued.returncode == 0 and "queued" in queued.stderr, queued.stderr
    follow = subprocess.Popen(cmd + ["logs", "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list = []
    reader = threading.Thread(target=lambda: said.extend(follow.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("held by" in line for line in said):
            time.sleep(0.1)
        assert any("waits in line on its hosts" in line for line in said), said
        assert any(line.startswith("waiting (") and "here0: held by" in line and "20261201-100000-aaaa" in line
                   for line in said), said
        assert follow.poll() is None  # still waiting, not "the run was not started"
        holder.release()  # its turn comes: the waiters start it, logs -f follows it to its end
        out, _ = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
    reader.join(5)
    assert follow.returncode == 0, said
    assert "[here0 r0] hi" in out and "[here1 r1] hi" in out, (out, said)
