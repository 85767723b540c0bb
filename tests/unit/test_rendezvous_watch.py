"""The hosts' rendezvous watchdog (remote/host/run/rendezvous.py) on real processes of this machine, its
times shortened: a rank listening on MASTER_PORT off rank 0's host, nothing listening on rank 0's while a
rank retries, a rank pointed at its own localhost (by its script, as the bootstrap notes it, or by its
arguments), an init_method elsewhere; and what it leaves alone."""

import os
import socket
import subprocess
import sys
import time

import pytest

from clusterrun.events import Rendezvous
from clusterrun.remote.host.observe.connecting import listeners, retrying, tree
from clusterrun.remote.host.paths import stacks_dir, stacks_file
from clusterrun.remote.host.run import rendezvous
from clusterrun.remote.host.run.bootstrap import __file__ as BOOTSTRAP
from clusterrun.remote.host.run.rendezvous import RendezvousWatch, is_loopback, read_env_notes, tcp_target

LISTEN = ("import socket, sys, time\n"
          "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True)\n"
          "time.sleep(60)\n")
RETRY = ("import socket, sys, time\n"  # torch's store client between tries: a refused socket, kept
         "s = socket.socket(); print(s.connect_ex(('127.0.0.1', int(sys.argv[1]))), flush=True)\n"
         "time.sleep(60)\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def procs():
    started = []

    def start(code, *args):
        p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout.readline()  # it is listening, or its connect was refused
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    for name in ("FIRST_LOOK", "LISTEN_AFTER", "LOCALHOST_AFTER", "NOTHING_AFTER"):
        monkeypatch.setattr(rendezvous, name, 0.0)


class FakeSupervisor:
    """What the watch reads of its supervisor: the spec, the ranks started (pid, started_at), the exits."""

    def __init__(self, tmp_path, node_rank, port, pids, argv=(), addr="198.18.0.1"):
        self.run_dir = str(tmp_path)
        os.makedirs(stacks_dir(self.run_dir), exist_ok=True)
        self.started = time.time()
        self.spec = {"node_rank": node_rank, "node": "node%d" % node_rank,
                     "peers": {"names": {"0": "node0", "1": "node1"}},
                     "ranks": [{"rank": r, "argv": [sys.executable, "train.py", *argv],
                                "env": {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}} for r in pids]}
        self.ranks = {str(r): {"pid": pid, "started_at": self.started - 1} for r, pid in pids.items()}
        self.exits = {}


def looks(watch, n=3):
    """n looks a second apart, as the supervisor's loop makes them: every finding."""
    now, found = time.time(), []
    for i in range(n):
        found += watch.tick(now + 1.1 * (i + 1))
    return found


def test_a_rank_listening_on_the_master_port_off_rank_0s_host_is_named(tmp_path, procs):
    port = free_port()
    p = procs(LISTEN, port)
    found = looks(RendezvousWatch.of(FakeSupervisor(tmp_path, 1, port, {2: p.pid})))
    assert [f["kind"] for f in found] == ["elsewhere"]
    assert found[0]["rank"] == 2 and found[0]["text"] == (
        f"node1 r2 listens on :{port} on its own host, not on node0 (MASTER_ADDR=198.18.0.1): the script chose its "
        "own rank or address, and its rank 0 is here; clusterrun gave rank 0 to node0 (set `job.start: {order: "
        "rank}` if the script takes its rank from a counter, or let it use RANK / --rank)")


def test_nothing_listening_on_rank_0s_host_while_a_rank_retries_is_named(tmp_path, procs):
    port = free_port()
    p = procs(RETRY, port)
    assert retrying(tree([p.pid])) and not listeners(port)
    found = looks(RendezvousWatch.of(FakeSupervisor(tmp_path, 0, port, {0: p.pid})))
    assert [f["kind"] for f in found] == ["nothing"]
    assert found[0]["text"].startswith(f"nothing listens on node0:{port} (MASTER_ADDR:MASTER_PORT) after 2 s while "
                                       "node0 r0 keeps trying to connect: the process that took rank 0 is on another "
                                       "host")


def test_rank_0s_host_listening_or_nobody_trying_says_nothing(tmp_path, procs):
    port = free_port()
    listener = procs(LISTEN, port)
    client = procs(RETRY, free_port())
    assert looks(RendezvousWatch.of(FakeSupervisor(tmp_path, 0, port, {0: listener.pid, 1: client.pid}))) == []
    quiet = procs("import time; print(1, flush=True); time.sleep(60)")
    assert looks(RendezvousWatch.of(FakeSupervisor(tmp_path, 0, free_port(), {0: quiet.pid}))) == []


def test_the_scripts_own_localhost_on_another_host_is_named_with_the_fix(tmp_path, procs):
    port = free_port()
    p = procs(RETRY, port)
    sup = FakeSupervisor(tmp_path, 1, port, {1: p.pid})
    with open(stacks_file(sup.run_dir, 1) + ".env", "w") as fh:
        fh.write("MASTER_ADDR=localhost\n")
    found = looks(RendezvousWatch.of(sup))
    assert [f["kind"] for f in found] == ["localhost"]
    assert found[0]["text"] == (
        f"node1 r1 connects to localhost:{port}, its own host, where nothing listens: the script sets "
        "MASTER_ADDR=localhost itself (the DDP tutorial's `os.environ['MASTER_ADDR'] = 'localhost'`); clusterrun "
        f"gave rank 0 to node0 (198.18.0.1:{port}): remove that line: clusterrun sets MASTER_ADDR and MASTER_PORT "
        "for every rank")


def test_localhost_in_the_ranks_arguments_is_named_too(tmp_path, procs):
    port = free_port()
    p = procs(RETRY, port)
    sup = FakeSupervisor(tmp_path, 1, port, {1: p.pid}, argv=["--dist-url", f"tcp://127.0.0.1:{port}"])
    found = looks(RendezvousWatch.of(sup))
    assert [f["kind"] for f in found] == ["localhost"]
    assert f"its own arguments say tcp://127.0.0.1:{port}" in found[0]["text"]
    assert "pass `tcp://{master_addr}:{master_port}` (or `{dist_url}`) in job.args" in found[0]["text"]


def test_an_init_method_at_another_host_is_named_at_once(tmp_path, procs):
    p = procs("import time; print(1, flush=True); time.sleep(60)")
    sup = FakeSupervisor(tmp_path, 0, free_port(), {0: p.pid}, argv=["--init-method=tcp://10.9.9.9:23456"])
    found = looks(RendezvousWatch.of(sup), n=1)
    assert [f["kind"] for f in found] == ["init_method"]
    assert found[0]["text"].startswith("node0 r0's own arguments say --init-method=tcp://10.9.9.9:23456: 10.9.9.9 "
                                       "is not rank 0's host node0 (198.18.0.1:")
    good = FakeSupervisor(tmp_path, 1, free_port(), {0: p.pid}, argv=["--init-method", "tcp://198.18.0.1:23456"])
    assert looks(RendezvousWatch.of(good)) == []


def test_each_finding_is_made_once_and_an_ended_rank_is_not_watched(tmp_path, procs):
    port = free_port()
    p = procs(LISTEN, port)
    sup = FakeSupervisor(tmp_path, 1, port, {2: p.pid})
    watch = RendezvousWatch.of(sup)
    assert len(looks(watch, 5)) == 1 and len(watch.findings) == 1
    sup2 = FakeSupervisor(tmp_path, 1, port, {2: p.pid})
    sup2.exits = {2: {"exit_code": 0}}
    assert looks(RendezvousWatch.of(sup2)) == []


def test_no_watch_for_one_host_torchrun_or_no_master_port(tmp_path):
    sup = FakeSupervisor(tmp_path, 0, 29500, {0: os.getpid()})
    assert RendezvousWatch.of(sup) is not None
    sup.spec["launcher"] = "torchrun"
    assert RendezvousWatch.of(sup) is None
    sup = FakeSupervisor(tmp_path, 0, 29500, {0: os.getpid()})
    sup.spec["peers"] = {}
    assert RendezvousWatch.of(sup) is None
    sup = FakeSupervisor(tmp_path, 0, "auto", {0: os.getpid()})
    assert RendezvousWatch.of(sup) is None


@pytest.mark.parametrize("argv, target", [
    (["--init-method", "tcp://10.0.0.1:29500"], ("10.0.0.1", "29500", "tcp://10.0.0.1:29500")),
    (["--dist-url=tcp://node1:23456"], ("node1", "23456", "--dist-url=tcp://node1:23456")),
    (["tcp://[::1]:40000"], ("::1", "40000", "tcp://[::1]:40000")),
    (["--init-method", "env://"], None),
    (["file:///shared/x"], None),
])
def test_the_tcp_address_in_a_ranks_arguments(argv, target):
    assert tcp_target(argv) == target


def test_loopback_names():
    assert all(is_loopback(h) for h in ("localhost", "127.0.0.1", "127.0.1.1", "::1"))
    assert not any(is_loopback(h) for h in ("node1", "10.0.0.1", "198.18.0.1"))


def test_the_bootstrap_notes_what_the_script_sets_itself(tmp_path):
    stacks = str(tmp_path / "rank-0")
    code = ("import os; os.environ['MASTER_ADDR'] = 'localhost'; os.environ['OTHER'] = 'x'; "
            "os.environ['MASTER_PORT'] = '12355'; print('ok')")
    done = subprocess.run([sys.executable, BOOTSTRAP, stacks, "0", "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    assert read_env_notes(stacks + ".env") == {"MASTER_ADDR": "localhost", "MASTER_PORT": "12355"}
    assert read_env_notes(str(tmp_path / "none.env")) == {}


def test_the_controller_says_it_once_with_the_times():
    ev = Rendezvous(1, "node1", "elsewhere", 2, "node1 r2 listens on :1 on its own host", 13.2, 3.1)
    assert ev.describe("inv.yaml") == ("rendezvous: node1 r2 listens on :1 on its own host (named 3 s after it "
                                       "began, 13 s after the rank started; the run goes on)")
    assert ev.key == (1, "elsewhere", 2)
    nothing = Rendezvous(0, "node0", "nothing", None, "nothing listens", 20.0)
    assert nothing.describe("inv.yaml") == "rendezvous: nothing listens (20 s after the rank started; the run goes on)"


def test_the_host_program_names_it_and_a_follow_carries_it_to_the_controller(host_client, tmp_path):
    """End to end on this machine: a supervisor of node 1 whose rank listens on MASTER_PORT records the
    finding (state.json, supervisor.log) with no controller; a later follow turns it into the event."""
    import queue

    from clusterrun.hosts.follow import Follower, LogFiles
    from hostkit import project, spec

    run_id, port = "20261202-000000-0350", free_port()
    host_client.push(run_id, project(tmp_path, {"job.py": b"x"}), hold=False)
    start = spec(run_id, [(1, [sys.executable, "-c", LISTEN, str(port)])], node_rank=1, node="node1",
                 peers={"names": {"0": "node0", "1": "node1"}})
    start["ranks"][0]["env"].update(MASTER_ADDR="198.18.0.1", MASTER_PORT=str(port))
    host_client.start(run_id, start)
    run_dir = tmp_path / "work" / "runs" / run_id
    deadline = time.monotonic() + 20
    while "rendezvous:" not in (run_dir / "supervisor.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"rendezvous: node1 r1 listens on :{port} on its own host" in (run_dir / "supervisor.log").read_text()
    out: queue.Queue = queue.Queue()
    follower = Follower(node_rank=1, host="node1", ranks=[1], files=LogFiles(rank=lambda r: str(tmp_path / "r.log")),
                        world_size=2, attempt_key=run_id, client=lambda reconnect: host_client, out=out,
                        host_lost_s=30, once=True)
    follower.start()
    follower.join(timeout=20)
    events = []
    while not out.empty():
        events.append(out.get())
    found = [e for e in events if isinstance(e, Rendezvous)]
    assert len(found) == 1 and found[0].kind == "elsewhere" and found[0].rank == 1 and found[0].held >= 2.5
    assert found[0].describe("inv.yaml").startswith(f"rendezvous: node1 r1 listens on :{port} on its own host")
    host_client.stop(run_id, 1.0)
