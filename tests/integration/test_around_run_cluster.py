"""Around a run, over real SSH on the container cluster: results back (`pull`, job.outputs), ports reached
from here (`forward`, job.ports), a word when it ends (`notify:`). One launch serves several assertions."""

import hashlib
import json
import signal
import threading
import urllib.request

import pytest

from faultkit import FAST
from support import free_port, listening, wait_for

pytestmark = pytest.mark.integration

WORK = "/home/cr/.clusterrun"
HOSTS = ("node0", "node1", "node2", "node3")


def host_sha(cluster, host, path):
    rc, out, err = cluster.exec(host, ["sha256sum", path])
    assert rc == 0, err
    return out.split()[0]


def sha(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pulled(cr, *args):
    done = cr.run("pull", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_pull_brings_outputs_back_incrementally_resumably_and_refuses_what_leads_out(cr, cluster, tmp_path):
    inv = cr.inventory(job={"script": "outputs.py", "args": ["--big-mb", "160"],
                            "outputs": ["outputs/model.pt", "outputs/r*.txt"]}, top={"timeouts": FAST})
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    run_id = cr.ps()[0]["id"]
    job = f"{WORK}/runs/{run_id}/job"
    here = cr.tmp / "cr-home" / "runs" / run_id / "outputs"
    # job.outputs came back when the attached run ended: rank 0's host's files, byte for byte
    assert f"job.outputs: 2 files from node0 in {here}" in done.stderr
    assert sha(here / "outputs" / "model.pt") == host_sha(cluster, "node0", f"{job}/outputs/model.pt")
    assert (here / "outputs" / "r0.txt").read_text() == "rank 0 of 4 on node0\n"
    assert cr.ps()[0]["pulled"] == ["node0"]
    # a second pull of unchanged files receives nothing
    again = pulled(cr, run_id)
    assert [(h["files"], h["fetched"], h["received_bytes"]) for h in again["hosts"]] == [(2, 0, 0)]
    every = pulled(cr, run_id, "--all-hosts", "outputs/r*.txt")
    assert sorted(h["host"] for h in every["hosts"]) == list(HOSTS)
    for rank, host in enumerate(HOSTS):
        assert (here / host / "outputs" / f"r{rank}.txt").read_text() == f"rank {rank} of 4 on {host}\n"

    # a pull cut in the middle (the controller killed) leaves a .part and no file under the final name;
    # the next one continues from it and ends with the host's bytes
    to = tmp_path / "big"
    part, final = to / "outputs" / ".big.bin.part", to / "outputs" / "big.bin"
    proc = cr.popen("pull", run_id, "outputs/big.bin", "--to", to)
    try:
        assert wait_for(lambda: part.exists() and part.stat().st_size > 8 << 20, timeout=60, every=0.01,
                        what="the pull under way")
    finally:
        proc.kill()
        proc.communicate()
    held = part.stat().st_size
    assert held < 160 << 20 and not final.exists()
    resumed = pulled(cr, run_id, "outputs/big.bin", "--to", to)["hosts"][0]
    assert resumed["resumed"] == 1 and resumed["received_bytes"] <= (160 << 20) - held
    assert sha(final) == host_sha(cluster, "node0", f"{job}/outputs/big.bin")
    assert not part.exists()

    # bad input: a clear error, exit 2, nothing written
    bad = tmp_path / "bad"
    for args, said in [(("../../..",), "leads out of the run's folder"),
                       (("/etc/passwd",), "node0: /etc/passwd is outside the run's job folder"),
                       (("--host", "node9"), "ran on node0, node1, node2, node3: no host 'node9'")]:
        refused = cr.run("pull", run_id, *args, "--to", bad)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
        assert not bad.exists()


def get(url):
    return urllib.request.urlopen(url, timeout=20).read()


def test_forward_and_job_ports_reach_a_server_on_rank_0s_host_while_the_run_lives(cr, cluster, tmp_path):
    port = free_port()  # free here; on node0 the job serves on localhost:port
    inv = cr.inventory(job={"script": "outputs.py", "args": ["--serve", port], "ports": [port]},
                       top={"timeouts": FAST})
    launch = cr.popen("launch", inv)
    forwards = []
    try:
        assert wait_for(lambda: cr.ps() and cr.ps()[0]["state"] == "running", timeout=60, what="the run")
        run_id = cr.ps()[0]["id"]
        page = f"{WORK}/runs/{run_id}/job/page.bin"
        assert wait_for(lambda: cluster.exec("node0", ["test", "-s", page])[0] == 0, timeout=30, what="the page")
        want = host_sha(cluster, "node0", page)
        # job.ports: the launch itself forwards 127.0.0.1:port here to localhost:port on node0
        assert wait_for(lambda: listening(port), timeout=30, what="job.ports")
        assert wait_for(lambda: _get_or_none(f"http://127.0.0.1:{port}/page.bin"), timeout=30, what="the server")
        # clusterrun forward, beside it, on a free local port
        fwd = cr.popen("forward", run_id, f"{port}:0")
        forwards.append(fwd)
        url = fwd.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert hashlib.sha256(get(f"{url}/page.bin")).hexdigest() == want
        bodies = []
        readers = [threading.Thread(target=lambda: bodies.append(hashlib.sha256(get(f"{url}/page.bin")).hexdigest()))
                   for _ in range(2)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(60)
        assert bodies == [want, want]
        fwd.send_signal(signal.SIGINT)  # Ctrl-C closes the port
        assert fwd.wait(20) == 130
        assert not listening(int(url.rsplit(":", 1)[1]))
        # a forward also ends with the run
        last = cr.popen("forward", run_id, f"{port}:0")
        forwards.append(last)
        assert last.stdout.readline().startswith("http://127.0.0.1:")
        assert cluster.exec("node0", ["touch", f"{WORK}/runs/{run_id}/job/stop-serving"])[0] == 0
        out, err = launch.communicate(timeout=60)
        assert launch.returncode == 0, err
        assert f"http://127.0.0.1:{port}  (localhost:{port} on node0)" in err
        assert last.wait(30) == 0 and "closed: the run ended" in last.stderr.read()
        assert not listening(port)  # the launch's own forward ended with it
        nothing = cr.run("pull", run_id)  # this run names no outputs
        assert nothing.returncode == 2 and "nothing to pull: it has no job.outputs" in nothing.stderr
    finally:
        for p in forwards + [launch]:
            if p.poll() is None:
                p.kill()
                p.communicate()


def _get_or_none(url):
    try:
        return get(url)
    except OSError:
        return None


def test_notify_runs_on_rank_0s_host_at_the_end_and_a_failing_or_hanging_one_changes_nothing(cr, cluster):
    cr.env["HOOK_TOKEN"] = "hook-2718281828"
    said = "/tmp/notified-by-clusterrun.txt"
    cluster.exec("node0", ["rm", "-f", said])
    inv = cr.inventory(job={"args": ["--no-dist", "--steps", "3", "--step-time", "0.2"]},
                       top={"timeouts": {**FAST, "notify": "2s"}, "secrets": ["HOOK_TOKEN"], "notify": [
                           f'echo "$CLUSTERRUN_RUN_ID $CLUSTERRUN_STATE $CLUSTERRUN_EXIT_CODE $HOOK_TOKEN" > {said}',
                           'echo "posting with $HOOK_TOKEN"; exit 22',
                           "sleep 600"]})
    started = cr.run("launch", "--detach", inv)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    line = wait_for(lambda: cluster.exec("node0", ["cat", said])[1], timeout=60, what="the notify")
    assert line == f"{run_id} succeeded 0 hook-2718281828\n"
    log = f"{WORK}/runs/{run_id}/notify.log"
    text = wait_for(lambda: (lambda t: t if "killed after 2s (timeouts.notify)" in t else "")(
        cluster.exec("node0", ["cat", log])[1]), timeout=30, what="the hanging notify killed")
    assert "posting with ***************\nclusterrun: exit 22" in text and "hook-2718281828" not in text
    assert cluster.exec("node1", ["test", "-e", f"{WORK}/runs/{run_id}/notify.log"])[0] != 0
    record = wait_for(lambda: [r for r in cr.ps() if r["id"] == run_id and r["state"] != "running"], timeout=30,
                      what="the run's end")[0]
    assert (record["state"], record["exit_code"]) == ("succeeded", 0)  # whatever the notify commands did
    cluster.exec("node0", ["rm", "-f", said])
