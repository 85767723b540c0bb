"""Around a run, on this machine (`connection: local`, two hosts with their own workdirs; the real CLI, real
processes, no torch): `pull` (incremental, per host, resumable, atomic, refusing what leads out of the
run), `forward` (several connections, Ctrl-C, the run's end), and `notify:` (what the commands are told;
a failing or hanging one changes nothing)."""

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
from functools import partial

import pytest

import support
from support import free_port, inventory_text, listening, write_tree

CLI = [sys.executable, "-m", "clusterrun"]
wait_for = partial(support.wait_for, timeout=15.0, every=0.05)  # this module's pace: local processes

JOB = textwrap.dedent("""\
    import argparse, functools, http.server, os, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int)
    p.add_argument("--world-size", type=int)
    p.add_argument("--serve", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0)
    p.add_argument("--fail", action="store_true")
    a = p.parse_args()
    os.makedirs("outputs", exist_ok=True)
    open(f"outputs/r{a.rank}.txt", "w").write(f"rank {a.rank} of {a.world_size}\\n")
    if a.rank == 0:
        with open("outputs/model.pt", "wb") as fh:
            fh.write(os.urandom(3 << 20))
        os.chmod("outputs/model.pt", 0o640)
        os.symlink("/etc/hostname", "outputs/elsewhere")  # out of the run: never followed
        os.symlink("r0.txt", "outputs/alias.txt")  # inside it: pulled as the file it names
        with open(os.path.join(os.environ["CLUSTERRUN_CHECKPOINT_DIR"], "epoch1.ckpt"), "wb") as fh:
            fh.write(b"c" * 5000)
    if a.serve and a.rank == 0:
        open("page.bin", "wb").write(os.urandom(1 << 20))
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=".")
        http.server.ThreadingHTTPServer(("127.0.0.1", a.serve), handler).serve_forever()
    time.sleep(a.sleep)
    if a.fail and a.rank == 1:
        sys.exit(3)
    print("rank", a.rank, "done", flush=True)
""")


@pytest.fixture
def project(tmp_path, cr_home, monkeypatch):
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    return write_tree(tmp_path, {"job.py": JOB})


def inventory(project, name="inv.yaml", job=None, top=None):
    job = {"script": "job.py", "timeout": "60s", **(job or {})}
    write_tree(project, {name: inventory_text(
        [{"name": "here0", "workdir": f"{project}/w0"}, {"name": "here1", "workdir": f"{project}/w1"}], job,
        defaults={"connection": "local"}, master={"port": "auto"}, timeouts={"grace": "3s", "notify": "2s"},
        **(top or {}))})
    return project / name


def cli(*args, timeout=60, **kw):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)


def latest(project):
    done = cli("ps", "--json", "--no-reconcile")
    return json.loads(done.stdout)[0]["id"]


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def host_file(project, run_id, rel, host=0):
    return project / f"w{host}" / "runs" / run_id / "job" / rel


def pull_json(*args):
    done = cli("pull", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_pull_brings_outputs_back_incrementally_per_host_and_refuses_what_leads_out(project, cr_home):
    done = cli("launch", inventory(project, job={"outputs": ["outputs/"]}))
    assert done.returncode == 0, done.stderr
    run_id = latest(project)
    here = cr_home / "runs" / run_id / "outputs"
    # pulled at the end of the attached run: rank 0's host's files, bytes and modes as there
    assert sha(here / "outputs" / "model.pt") == sha(host_file(project, run_id, "outputs/model.pt"))
    assert os.stat(here / "outputs" / "model.pt").st_mode & 0o777 == 0o640
    assert (here / "outputs" / "alias.txt").read_text() == "rank 0 of 2\n" and not (here / "outputs" / "r1.txt").exists()
    assert not (here / "outputs" / "elsewhere").exists()
    assert f"job.outputs: 3 files from here0 in {here}" in done.stderr
    assert re.search(r"pull: 1 host in [\d.]+ s, .* received \(3 files new or changed\)", done.stderr), done.stderr
    again, _ = pull_json(run_id)  # unchanged: nothing is sent
    assert [(h["files"], h["fetched"], h["received_bytes"]) for h in again["hosts"]] == [(3, 0, 0)]
    assert again["hosts"][0]["skipped"] == [["outputs/elsewhere", "a symlink out of the run's folder: not followed"]]
    (project / "w0" / "cache" / "pull-sums.json").unlink()  # the host hashes nothing until asked to compare
    compared, _ = pull_json(run_id)
    assert [(h["fetched"], h["received_bytes"]) for h in compared["hosts"]] == [(0, 0)]
    host_file(project, run_id, "outputs/r0.txt").write_text("rank 9 of 2\n")  # the same size, other bytes
    changed, _ = pull_json(run_id)
    assert changed["hosts"][0]["fetched"] == 2 and (here / "outputs" / "r0.txt").read_text() == "rank 9 of 2\n"
    assert json.loads(cli("ps", "--json").stdout)[0]["pulled"] == ["here0"]
    every, _ = pull_json(run_id, "--all-hosts", "outputs/*.txt", "checkpoints/")
    assert json.loads(cli("ps", "--json").stdout)[0]["pulled"] == ["here0"]  # not job.outputs: not counted
    assert sorted(str(p.relative_to(here)) for p in here.rglob("*") if p.is_file() and p.parts[-3] != "outputs") == [
        "here0/checkpoints/epoch1.ckpt", "here0/outputs/alias.txt", "here0/outputs/r0.txt", "here1/outputs/r1.txt"]
    assert not any(p.name.endswith(".part") for p in here.rglob("*"))
    # bad input: exit 2, a clear message, nothing written
    bad = project / "bad"
    for args, said in [(("../w1",), "leads out of the run's folder"),
                       (("/etc/passwd",), "/etc/passwd is outside the run's job folder"),
                       (("outputs/", "--host", "nope"), "ran on here0, here1: no host 'nope'"),
                       (("nothing/",), "nothing to pull: nothing/ matched no file on here0")]:
        refused = cli("pull", run_id, *args, "--to", bad)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
        assert not bad.exists()
    plain = cli("launch", inventory(project, "plain.yaml"))
    assert plain.returncode == 0, plain.stderr
    nothing = cli("pull", "--to", bad)
    assert nothing.returncode == 2 and "nothing to pull: it has no job.outputs" in nothing.stderr
    assert not bad.exists()
    # a detached run whose job.outputs selected nothing: pull says there is nothing to keep, and clean no
    # longer keeps it for a pull that can never bring anything (issue 36: they sent you in a circle)
    none = cli("launch", "--detach", inventory(project, "none.yaml", job={"outputs": ["missing/"]}))
    assert none.returncode == 0, none.stderr
    gone = latest(project)
    wait_for(lambda: json.loads(cli("ps", "--json").stdout)[0]["state"] == "succeeded", timeout=30, every=0.2)
    empty = cli("pull", gone, "--to", bad)
    assert empty.returncode == 2 and "missing/ matched no file on here0" in empty.stderr, empty.stderr
    assert "the run has ended, so it has no outputs to keep" in " ".join(empty.stderr.split())
    cleaned = cli("clean", "--json", gone)
    assert cleaned.returncode == 0, cleaned.stderr
    assert gone in {r["id"] for h in json.loads(cleaned.stdout)["hosts"] for r in h["removed"]}, cleaned.stdout


def test_a_cut_pull_resumes_from_its_part_file_and_never_leaves_half_a_file(project, cr_home):
    from clusterrun.config.inventory import Timeouts
    from clusterrun.hosts.client import make_connect
    from clusterrun.runs.pull import pull_run
    from clusterrun.registry.store import RunStore

    assert cli("launch", inventory(project)).returncode == 0
    run_id = latest(project)
    store = RunStore(str(cr_home))
    to = project / "got"
    got = []
    assert store.get(run_id).pulled == ()  # this run names no job.outputs: nothing to wait for
    cut = pull_run(store, run_id, make_connect(Timeouts()), paths=["outputs/model.pt"], to=str(to),
                   post=lambda ev: got.append(getattr(ev, "done", 0)), stop=lambda: max(got, default=0) >= 1 << 20)
    assert cut.interrupted and not (to / "outputs" / "model.pt").exists()
    part = to / "outputs" / ".model.pt.part"
    held = part.stat().st_size
    assert 0 < held < 3 << 20
    assert store.get(run_id).pulled == ()  # a pull that did not complete is not one
    resumed = pull_run(store, run_id, make_connect(Timeouts()), paths=["outputs/model.pt"], to=str(to))
    assert (resumed.hosts[0].resumed, resumed.hosts[0].received) == (1, (3 << 20) - held)
    assert sha(to / "outputs" / "model.pt") == sha(host_file(project, run_id, "outputs/model.pt"))
    assert not part.exists() and store.get(run_id).pulled == ("here0",)  # (an empty job.outputs is covered)
    # a .part that is not the file's beginning: the host starts over, the result is still the host's file
    (to / "outputs" / "model.pt").unlink()
    part.write_bytes(b"not the model" * 1000)
    fresh = pull_run(store, run_id, make_connect(Timeouts()), paths=["outputs/model.pt"], to=str(to))
    assert (fresh.hosts[0].resumed, fresh.hosts[0].received) == (0, 3 << 20)
    assert sha(to / "outputs" / "model.pt") == sha(host_file(project, run_id, "outputs/model.pt"))


def test_forward_serves_several_connections_and_ends_on_ctrl_c_or_the_runs_end(project):
    port = free_port()
    started = cli("launch", "--detach", inventory(project, job={"args": ["--serve", port]}))
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert wait_for(lambda: listening(port))
    page = host_file(project, run_id, "page.bin").read_bytes()
    fwd = subprocess.Popen(CLI + ["forward", run_id, f"{port}:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        url = fwd.stdout.readline().strip()
        local = int(url.rsplit(":", 1)[1])
        assert local != port
        assert urllib.request.urlopen(f"{url}/page.bin", timeout=10).read() == page
        bodies = []
        readers = [threading.Thread(target=lambda: bodies.append(urllib.request.urlopen(f"{url}/page.bin",
                                                                                      timeout=10).read()))
                   for _ in range(3)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        assert bodies == [page] * 3
        held = socket.create_connection(("127.0.0.1", local), timeout=10)  # a request half sent, held open
        held.sendall(b"GET /page.bin HTTP/1.0\r\n")
        assert urllib.request.urlopen(f"{url}/page.bin", timeout=10).read() == page  # served meanwhile
        held.sendall(b"\r\n")
        answer = b"".join(iter(lambda: held.recv(1 << 16), b""))
        held.close()
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(page)
        snapshot = cli("pull", run_id, "page.bin", "--to", project / "snap")  # a running run: its files as they are
        assert snapshot.returncode == 0 and "had not ended: its files as they were just now" in snapshot.stderr
        assert (project / "snap" / "page.bin").read_bytes() == page
        taken = cli("forward", run_id, f"{port}:{local}")  # the forward holds it
        assert taken.returncode == 2 and f"127.0.0.1:{local} is already taken here" in taken.stderr
        fwd.send_signal(signal.SIGINT)
        assert fwd.wait(10) == 130
        assert not listening(local)
        dead = free_port()  # nothing listens there (yet): said so, not "unreachable" (issue 36, item 18)
        idle = subprocess.Popen(CLI + ["forward", run_id, f"{dead}:0"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        idle_url = idle.stdout.readline().strip()
        with pytest.raises(OSError):
            urllib.request.urlopen(idle_url, timeout=10).read()
        idle.send_signal(signal.SIGINT)
        assert idle.wait(10) == 130
        said = idle.stderr.read()
        assert f"nothing listens on localhost:{dead} on here0 yet" in said and "unreachable" not in said, said
        again = subprocess.Popen(CLI + ["forward", run_id, f"{port}:0"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        url = again.stdout.readline().strip()
        assert cli("stop", run_id).returncode == 0
        assert again.wait(15) == 0 and "closed: the run ended" in again.stderr.read()
        assert not listening(int(url.rsplit(":", 1)[1]))
    finally:
        for p in (fwd, locals().get("idle"), locals().get("again")):
            if p is not None and p.poll() is None:
                p.kill()
    ended = cli("forward", run_id, str(port))
    assert ended.returncode == 2 and "is not running on here0 (it has ended)" in ended.stderr


def test_notify_runs_on_rank_0s_host_with_the_end_and_a_failing_or_hanging_one_changes_nothing(project, monkeypatch):
    monkeypatch.setenv("HOOK_TOKEN", "tok-3141592653")
    said = project / "said.txt"
    top = {"secrets": ["HOOK_TOKEN"],
           "notify": [f'echo "$CLUSTERRUN_RUN_ID $CLUSTERRUN_STATE $CLUSTERRUN_EXIT_CODE [$CLUSTERRUN_REASON] $HOOK_TOKEN" >> {said}',
                      'echo "token $HOOK_TOKEN"; exit 3',
                      'sleep 60']}
    ok = cli("launch", "--detach", inventory(project, job={"args": ["--sleep", "0.5"]}, top=top))
    assert ok.returncode == 0, ok.stderr
    run_id = ok.stdout.strip()
    assert wait_for(lambda: said.exists())
    assert said.read_text() == f"{run_id} succeeded 0 [] tok-3141592653\n"
    log = project / "w0" / "runs" / run_id / "notify.log"
    assert wait_for(lambda: "killed after 2s (timeouts.notify)" in log.read_text())
    text = log.read_text()
    assert "token **************\nclusterrun: exit 3" in text and "tok-3141592653" not in text
    assert not (project / "w1" / "runs" / run_id / "notify.log").exists()  # rank 0's host only
    assert json.loads(cli("ps", "--json").stdout)[0]["state"] == "succeeded"  # whatever notify did
    failed = cli("launch", "--detach", inventory(project, "fail.yaml", job={"args": ["--fail"]}, top=top))
    run_id = failed.stdout.strip()
    assert wait_for(lambda: len(said.read_text().splitlines()) == 2)
    line = said.read_text().splitlines()[1]
    assert line.startswith(f"{run_id} failed 1 [") and "rank 1" in line, line
    assert wait_for(lambda: json.loads(cli("ps", "--json").stdout)[0]["state"] == "failed")
    # CLUSTERRUN_REASON is ps's reason, word for word (issue 36: "rank 1 on node 1 failed" against "rank 1
    # on node1: exit code 1"): both say it with remote/host/words.py
    reason = json.loads(cli("ps", "--json").stdout)[0]["reason"]
    assert reason == "rank 1 on here1: exit code 3" and line == f"{run_id} failed 1 [{reason}] tok-3141592653", line


def test_port_specs_and_what_the_url_line_says():
    from clusterrun.errors import UsageError
    from clusterrun.cli.pull import parse_spec
    from clusterrun.transport.forward import PortSpec
    from clusterrun.ui.ports import banner

    assert parse_spec("6006") == PortSpec(6006, 6006)
    assert parse_spec("6006:16006") == PortSpec(6006, 16006)
    assert parse_spec("8888:0") == PortSpec(8888, 0)
    for bad in ("", "x", "0", "70000", "6006:x", "6006:70000", ":6006"):
        with pytest.raises(UsageError):
            parse_spec(bad)
    assert banner(6006, 6006, "node0") == "TensorBoard? http://127.0.0.1:6006  (localhost:6006 on node0)"
    assert banner(7000, 17000, "node1") == "http://127.0.0.1:17000  (localhost:7000 on node1)"


def test_what_a_pull_path_selects_on_the_host():
    from clusterrun.remote.host.observe.pull import _selected

    def sel(pattern, path):
        return _selected(pattern.split("/"), path.split("/"))

    assert sel("*.pt", "model.pt") and not sel("*.pt", "outputs/model.pt")  # `*` stays within one name
    assert sel("**/*.pt", "outputs/model.pt") and sel("**/*.pt", "model.pt") and sel("**/*.pt", "a/b/c.pt")
    assert sel("outputs/r*.txt", "outputs/r12.txt") and not sel("outputs/r*.txt", "outputs/x/r1.txt")
    assert sel("out*", "outputs/deep/file.bin")  # a folder it matches brings everything under it
    assert not sel("outputs/[ab].txt", "outputs/c.txt") and sel("outputs/[ab].txt", "outputs/b.txt")
