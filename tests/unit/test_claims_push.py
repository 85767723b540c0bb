"""Claims through the real host program (`connection: local`, real processes): a busy host is found before
anything is made, a claim passes from the push to the supervisor and goes at the run's end, `--wait` takes
its turn, two launches for the same two hosts never both win, a launch that goes silent or is abandoned
leaves no entry, and `--detach --wait` starts by itself on two "hosts" meeting over loopback."""

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from functools import partial

import pytest

from clusterrun.config.inventory import Timeouts
from clusterrun.errors import ClaimDropped, HostBusy
from clusterrun.hosts.client import HostClient
from clusterrun.launch.claiming import ClaimGroup
from clusterrun.remote.host.procs import start_ticks
from clusterrun.remote.host.share.claims import Claims
from clusterrun.transport.local import LocalTransport
import support
from hostkit import make_host, project, spec


def machine(tmp_path, name):
    """A "host": its own workdir and claims folder."""
    (tmp_path / name).mkdir(exist_ok=True)
    host = replace(make_host(tmp_path / name / "work"), name=name)
    return HostClient(host, LocalTransport(name), Timeouts(command=20)), str(tmp_path / name / "claims")


def request(folder, run, node, *, slots=1, wait=False, detach=False, ticket=None, silence=20.0):
    return {"dir": folder, "run": run, "node": node, "by": "tester@here", "slots": slots, "gpus": None,
            "gpu_count": slots, "capacity": 1, "ticket": [ticket or time.time(), run], "wait": wait,
            "detach": detach, "contend": 3.0, "silence": silence}


def hold(folder, run="theirs", pid=None):
    """Another run's claim on the whole host, owned by pid (default: this test process)."""
    c = Claims(request(folder, run, "x"))
    assert c.admit() == {"granted": []}
    pid = pid or __import__("os").getpid()
    c.set_claim("running", pid=pid, ticks=start_ticks(pid))
    return c


def entries(folder):
    import os

    return sorted(n for n in os.listdir(folder) if not n.startswith(".")) if os.path.isdir(folder) else []


def live(folder, run):
    """The run's live entries (a local host's receiving end is killed when its stream closes, where an SSH
    one sees the end of its input and removes them itself: either way nothing of it counts)."""
    from clusterrun.remote.host.share.claims import Folder

    return [e["file"] for e in Folder(folder).entries(prune=False) if e["run"] == run and e["live"]]


def push_all(clients, manifest, run, reqs, *, wait=False, detach=False, wait_timeout=None, delays=None):
    """Every host's push at once (or after delays[i] seconds), meeting in one ClaimGroup, as the runner
    does: {index: HeldPush or error}."""
    group = ClaimGroup([c.host.name for c in clients], wait=wait, detach=detach, wait_timeout=wait_timeout)
    out = {}

    def one(i):
        time.sleep((delays or {}).get(i, 0))
        try:
            out[i] = clients[i].push(run, manifest, claim=(reqs[i], group, i), coordinator=i == 0 and len(clients) > 1)
        except Exception as exc:  # what the fan-out would collect
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    return group, out, threads


JOB = {"job.py": b"import sys, time\ntime.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)\n"}


def start_spec(run, req, seconds=0.0):
    return spec(run, [(0, [sys.executable, "job.py", str(seconds)])], claim=dict(req, keep_s=0))


wait_for = partial(support.wait_for, timeout=20.0, every=0.05)  # this module's pace: local processes


def test_a_busy_host_names_its_holder_and_nothing_is_made(tmp_path):
    client, folder = machine(tmp_path, "m0")
    m = project(tmp_path, JOB)
    hold(folder)
    group, out, threads = push_all([client], m, "r1", [request(folder, "r1", "m0")])
    for t in threads:
        t.join(30)
    assert isinstance(out[0], HostBusy) and out[0].holders[0].run == "theirs", out[0]
    assert out[0].exit_code == 5
    assert not (tmp_path / "m0" / "work" / "runs" / "r1").exists()  # no run folder was made
    assert entries(folder) == [f"{__import__('os').getuid()}-theirs-x.claim"]
    client.close()


def test_the_supervisor_adopts_the_claim_and_gives_it_up_at_the_end(tmp_path):
    client, folder = machine(tmp_path, "m0")
    m = project(tmp_path, JOB)
    req = request(folder, "r1", "m0")
    group, out, threads = push_all([client], m, "r1", [req])
    for t in threads:
        t.join(30)
    state = out[0].start(start_spec("r1", req, seconds=1.5))
    claim = json.loads((tmp_path / "m0" / "claims" / f"{__import__('os').getuid()}-r1-m0.claim").read_text())
    assert claim["pid"] == state["supervisor"]["pid"] and claim["state"] == "running"
    verdict = Claims(request(folder, "r2", "m0")).admit(take=False)
    assert ([h["run"] for h in verdict.pop("holders")], verdict) == \
        (["r1"], {"blocked": True, "ahead": [], "position": 1, "retry": False,
                  "sums": {"need": 1, "capacity": 1, "used": 1, "gpus_wanted": 0, "gpus": 0}})
    assert wait_for(lambda: (tmp_path / "m0" / "work" / "runs" / "r1" / "done.json").exists())
    assert wait_for(lambda: entries(folder) == [])
    client.close()


def test_wait_takes_its_turn_when_the_holder_goes(tmp_path):
    client, folder = machine(tmp_path, "m0")
    m = project(tmp_path, JOB)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        hold(folder, pid=holder.pid)
        req = request(folder, "r1", "m0", wait=True)
        group, out, threads = push_all([client], m, "r1", [req], wait=True)
        assert wait_for(lambda: any(n.endswith("-r1-m0.queue") for n in entries(folder)))
        time.sleep(1.5)
        assert 0 not in out  # still in line
        holder.kill()
        holder.wait()
        for t in threads:
            t.join(30)
        assert out[0].result.files == 1, out[0]
        assert group.wait_seconds > 1.0
        out[0].start(start_spec("r1", req))
    finally:
        holder.kill()
    assert wait_for(lambda: entries(folder) == [])
    client.close()


def test_two_launches_for_the_same_two_hosts_at_once_never_both_give_up(tmp_path):
    """X and Y each want both hosts, and each gets to one host first: X (the older launch) holds m0 when
    it reaches m1, held by Y, and Y holds m1 when it reaches m0. Exactly one of them gets both (the
    other is told busy), never both giving up with one host each; three times, then at the same instant."""
    m = project(tmp_path, JOB)
    for round_no, stagger in enumerate((1.0, 1.0, 1.0, 0.0, 0.0)):
        hosts = [machine(tmp_path, f"m{i}") for i in range(2)]
        clients = [c for c, _ in hosts]
        runs = {}
        for run, delays in ((f"x{round_no}", {1: stagger}), (f"y{round_no}", {0: stagger})):
            ticket = time.time()
            reqs = [request(folder, run, f"m{i}", ticket=ticket) for i, (_, folder) in enumerate(hosts)]
            runs[run] = push_all(clients, m, run, reqs, delays=delays)
        for _, _, threads in runs.values():
            for t in threads:
                t.join(60)
        won = [run for run, (_, out, _) in runs.items() if all(hasattr(v, "result") for v in out.values())]
        lost = [run for run, (_, out, _) in runs.items()
                if all(isinstance(v, (HostBusy, ClaimDropped)) for v in out.values())]
        assert len(won) == 1 and len(lost) == 1, {r: out for r, (_, out, _) in runs.items()}
        if stagger:
            assert won == [f"x{round_no}"]  # the older one
        for v in runs[won[0]][1].values():
            v.abandon()
        for c in clients:
            c.close()


def test_an_abandoned_wait_leaves_no_entry(tmp_path):
    client, folder = machine(tmp_path, "m0")
    m = project(tmp_path, JOB)
    hold(folder)
    group, out, threads = push_all([client], m, "r1", [request(folder, "r1", "m0", wait=True)], wait=True)
    assert wait_for(lambda: any(n.endswith("-r1-m0.queue") for n in entries(folder)))
    group.abort()  # what Ctrl-C does (the runner closes its connections too)
    client.close()
    for t in threads:
        t.join(30)
    assert wait_for(lambda: live(folder, "r1") == [])
    Claims(request(folder, "r2", "m0")).admit(take=False)  # the next check of this user removes it
    assert not any("-r1-" in n for n in entries(folder))


def test_a_launch_that_goes_silent_is_dropped_from_the_line(tmp_path):
    """A controller whose machine went to sleep sends no probe: after its silence the host gives up."""
    from clusterrun.hosts.wire import pack_msg, read_msg

    client, folder = machine(tmp_path, "m0")
    m = project(tmp_path, JOB)
    hold(folder)
    client.install()
    stream = client.transport.open(client.argv("receive", "r1"))
    try:
        stream.write(pack_msg({**m.wire(), "hold": True, "claim": request(folder, "r1", "m0", wait=True,
                                                                          silence=1.0)}))
        status = read_msg(stream, 10)["queued"]
        assert [h["run"] for h in status.pop("holders")] == ["theirs"]
        me = __import__("pwd").getpwuid(__import__("os").getuid()).pw_name
        assert status == {"ready": False, "position": 1, "ahead": [], "why": f"{me}'s run theirs (running)",
                          "sums": {"need": 1, "capacity": 1, "used": 1, "gpus_wanted": 0, "gpus": 0}}
        assert any(n.endswith("-r1-m0.queue") for n in entries(folder))
        assert wait_for(lambda: not any("-r1-" in n for n in entries(folder)), timeout=10)
        assert stream.wait(10) != 0
    finally:
        stream.close()


def test_detach_wait_starts_by_itself_on_two_hosts(tmp_path):
    """--detach --wait: both hosts busy; the job is pushed and handed to waiters, which meet over
    loopback; when the holders go, both start (and the claims go with the run's end)."""
    from clusterrun.launch.claiming import wait_mesh  # noqa: F401  (the runner builds the same mesh)

    hosts = [machine(tmp_path, f"m{i}") for i in range(2)]
    m = project(tmp_path, JOB)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _, folder in hosts:
            hold(folder, pid=holder.pid)
        reqs = [request(folder, "r1", f"m{i}", wait=True, detach=True) for i, (_, folder) in enumerate(hosts)]
        group, out, threads = push_all([c for c, _ in hosts], m, "r1", reqs, wait=True, detach=True)
        for t in threads:
            t.join(30)
        assert group.handed_off and all(hasattr(v, "result") for v in out.values()), out
        token = "ab" * 16
        common = {"token": token, "run": "r1", "host_lost": 6, "join_timeout": 20, "timeout": None,
                  "bind": "127.0.0.1"}
        meshes = [dict(common, coordinator=True, expect=[1], allow=["127.0.0.1"], node_rank=0),
                  dict(common, addr="127.0.0.1", port=out[0].wait_port, node_rank=1)]
        for i, held in out.items():
            assert held.wait(start_spec("r1", reqs[i]), meshes[i])["pid"] > 0
        time.sleep(2.0)
        runs = [tmp_path / f"m{i}" / "work" / "runs" / "r1" for i in range(2)]
        assert not any((r / "spec.json").exists() for r in runs)  # still waiting
        assert all(json.loads((r / "waiter.json").read_text())["pid"] for r in runs)
        holder.kill()
        holder.wait()
        assert wait_for(lambda: all((r / "done.json").exists() for r in runs), timeout=30), \
            [(r / "waiter.log").read_text() for r in runs]
        assert wait_for(lambda: all(entries(f) == [] for _, f in hosts))
    finally:
        holder.kill()
        for c, _ in hosts:
            c.close()


def test_stop_ends_a_detached_wait(tmp_path):
    client, folder = machine(tmp_path, "m0")
    m = project(tmp_path, JOB)
    hold(folder)
    req = request(folder, "r1", "m0", wait=True, detach=True)
    group, out, threads = push_all([client], m, "r1", [req], wait=True, detach=True)
    for t in threads:
        t.join(30)
    mesh = {"token": "cd" * 16, "run": "r1", "host_lost": 6, "coordinator": True, "expect": [], "node_rank": 0}
    out[0].wait(start_spec("r1", req), mesh)
    run = tmp_path / "m0" / "work" / "runs" / "r1"
    assert wait_for(lambda: (run / "waiter.json").exists())
    assert client.status("r1")["waiting"] is True
    answer = client.stop("r1", 1.0)
    assert "never started" in answer.get("note", "")
    assert not any("-r1-" in n for n in entries(folder))
    client.close()


@pytest.mark.parametrize("timeout", [1.0])
def test_a_wait_timeout_is_busy_with_whoever_holds_the_host(tmp_path, timeout):
    client, folder = machine(tmp_path, "m0")
    m = project(tmp_path, JOB)
    hold(folder)
    group, out, threads = push_all([client], m, "r1", [request(folder, "r1", "m0", wait=True)], wait=True,
                                   wait_timeout=timeout)
    for t in threads:
        t.join(30)
    assert isinstance(out[0], HostBusy) and out[0].holders[0].run == "theirs"
    assert "still held by" in str(out[0])
    assert wait_for(lambda: live(folder, "r1") == [])
    client.close()
