"""Scripts that choose their own rank (issue 35), on the container cluster with its shared folder
(/shared on every host): a lab's rank counter with data at a fixed path there, started all at once
(arbitrary ranks; the rendezvous watchdog names why nobody can join) and in rank order (job.start), and
the DDP tutorial's `MASTER_ADDR = 'localhost'` on several hosts; attached and with --detach."""

from __future__ import annotations

import re
import time

import pytest

from faultkit import FAST

pytestmark = pytest.mark.integration

ELSEWHERE_S = 4  # the documented times (docs/scripts.md): a listener on the wrong host, localhost (after it
# began, and a look a second)
NOTHING_S = 20  # nothing listens on rank 0's host (after the ranks started)
LAB = "/shared/lab"


def lab(cluster, values="1 2 3"):
    """The share as the lab has it: data at its fixed path, the counter at 0."""
    rc, _, err = cluster.exec("node0", ["sh", "-c", f"mkdir -p {LAB} && echo '{values}' > {LAB}/data.txt && "
                                                    f"rm -f {LAB}/rank_counter"])
    assert rc == 0, err


def counter_inventory(cr, name, start=None, slow_first=False):
    """3 hosts x 1 rank; the script takes its rank from the counter; with slow_first node0 is late (as a
    machine that boots slower), so the counter's rank 0 goes to another host."""
    job = {"script": "counter_rank.py", "rank_flags": False,
           "args": ["--init-method", "tcp://{master_addr}:{master_port}", "--world-size", "{world_size}",
                    "--timeout", "30"]}
    if start:
        job["start"] = start

    def edit(hosts):
        if slow_first:
            hosts[0]["env"] = {**hosts[0].get("env", {}), "LAB_SLOW_START": "4"}

    return cr.inventory(name, hosts=3, job=job, defaults={"slots": 1}, top={"timeouts": FAST}, edit_hosts=edit)


def named_after(text, words):
    """The seconds a watchdog warning with these words says it came after what it names began."""
    m = re.search(re.escape(words) + r".*?\(named (\d+) s after it began", text)
    assert m, f"no warning with {words!r} in:\n{text}"
    return int(m.group(1))


def test_counter_ranks_all_at_once_fail_and_the_watchdog_names_why(cr, cluster):
    lab(cluster)
    inv = counter_inventory(cr, "all.yaml", slow_first=True)
    t = time.monotonic()
    done = cr.run("launch", inv, timeout=150)
    print(done.stderr)  # the live view, for the closing note
    assert done.returncode == 1, done.stderr
    port = re.search(r"listens on :(\d+) on its own host", done.stderr).group(1)
    # node0 came last: the counter's rank 0 went to node1 or node2, which listens on its own host
    listener = re.search(r"rendezvous: (node[12]) r[12] listens on :%s on its own host, not on node0" % port,
                         done.stderr)
    assert listener, done.stderr
    assert "the script chose its own rank or address" in done.stderr
    assert "clusterrun gave rank 0 to node0 (set `job.start: {order: rank}`" in done.stderr
    assert named_after(done.stderr, "listens on :%s" % port) <= ELSEWHERE_S
    assert f"rendezvous: nothing listens on node0:{port} (MASTER_ADDR:MASTER_PORT) after " in done.stderr
    # 20 s after the ranks started, once node0's rank is trying (it came 4 s late, then imports torch)
    after = int(re.search(r"nothing listens on node0:\d+ \S+ after (\d+) s while node0 r0 keeps trying", done.stderr)[1])
    assert NOTHING_S <= after <= NOTHING_S + 15
    assert time.monotonic() - t < 120


def test_counter_ranks_in_rank_order_succeed_five_times_out_of_five(cr, cluster):
    inv = counter_inventory(cr, "ordered.yaml", start={"order": "rank", "gap": "2s"}, slow_first=False)
    dry = cr.run("launch", "--dry-run", inv)
    assert "# start: in rank order, host after host, 2 s after" in dry.stdout
    assert re.search(r"#   \+0 s  node0 r0\n#   \+2 s  node1 r1\n#   \+4 s  node2 r2", dry.stdout), dry.stdout
    for attempt in range(5):
        lab(cluster)
        done = cr.run("launch", inv, timeout=150)
        if attempt == 0:
            print(done.stderr)  # the live view, for the closing note
        assert done.returncode == 0, done.stderr
        took = dict(re.findall(r"^\[(node\d) r\d\] took rank (\d) of 3", done.stdout, re.M))
        assert took == {"node0": "0", "node1": "1", "node2": "2"}, done.stdout
        assert all(f"rank {r} on node{r} sum 6" in done.stdout for r in range(3)), done.stdout
        assert "start: node1 (r1), host 2 of 3 in rank order, 2 s after the host before it" in done.stderr
        assert "rendezvous:" not in done.stderr


def test_a_slow_first_host_waits_its_turn_in_rank_order(cr, cluster):
    """Starting means the host's ranks started: a late rank 0 still takes the counter first only with a gap
    that covers it (the gap is the user's knob)."""
    lab(cluster)
    inv = counter_inventory(cr, "slow.yaml", start={"order": "rank", "gap": "6s"}, slow_first=True)
    done = cr.run("launch", inv, timeout=150)
    assert done.returncode == 0, done.stderr
    took = dict(re.findall(r"^\[(node\d) r\d\] took rank (\d) of 3", done.stdout, re.M))
    assert took == {"node0": "0", "node1": "1", "node2": "2"}, done.stdout


def test_two_ranks_per_host_start_rank_after_rank(cr, cluster):
    lab(cluster, "1 2 3 4")
    job = {"script": "counter_rank.py", "rank_flags": False, "start": {"order": "rank", "gap": "2s"},
           "args": ["--init-method", "tcp://{master_addr}:{master_port}", "--world-size", "{world_size}"]}
    inv = cr.inventory("two.yaml", hosts=2, job=job, defaults={"slots": 2}, top={"timeouts": FAST})
    done = cr.run("launch", inv, timeout=150)
    assert done.returncode == 0, done.stderr
    took = re.findall(r"^\[(node\d) r(\d)\] took rank (\d) of 4", done.stdout, re.M)
    assert sorted(took) == [("node0", "0", "0"), ("node0", "1", "1"), ("node1", "2", "2"), ("node1", "3", "3")]


def test_the_tutorials_localhost_on_another_host_is_named(cr, cluster):
    inv = cr.inventory("tutorial.yaml", hosts=2, job={"script": "tutorial_localhost.py", "rank_flags": False},
                       defaults={"slots": 1, "env": {"LAB_TIMEOUT": "20"}}, top={"timeouts": FAST})
    done = cr.run("launch", inv, timeout=150)
    assert done.returncode == 1, done.stderr
    port = re.search(r"connects to localhost:(\d+), its own host", done.stderr).group(1)
    assert (f"rendezvous: node1 r1 connects to localhost:{port}, its own host, where nothing listens: the script "
            "sets MASTER_ADDR=localhost itself") in done.stderr
    assert "remove that line: clusterrun sets MASTER_ADDR and MASTER_PORT for every rank" in done.stderr
    assert named_after(done.stderr, "connects to localhost") <= ELSEWHERE_S + 1


def _logs_until(cr, words, seconds):
    """`clusterrun logs latest` (no controller: the run is detached) until every one of words is there."""
    deadline = time.monotonic() + seconds
    while True:
        out = cr.run("logs", "latest")
        text = out.stdout + out.stderr
        if all(w in text for w in words) or time.monotonic() > deadline:
            return text
        time.sleep(2)


def test_the_watchdog_speaks_for_detached_runs_too(cr, cluster):
    lab(cluster)
    t = time.monotonic()
    assert cr.run("launch", "--detach", counter_inventory(cr, "det.yaml", slow_first=True)).returncode == 0
    # the first of the attached run's two warnings is enough to show the detached path speaks (the second
    # comes 20 s after the start: the attached test waits for it)
    text = _logs_until(cr, ["listens on :"], 30)
    assert re.search(r"rendezvous: node[12] r[12] listens on :\d+ on its own host, not on node0", text), text
    assert time.monotonic() - t < 30
    cr.run("stop", "latest")
    inv = cr.inventory("det-tutorial.yaml", hosts=2, job={"script": "tutorial_localhost.py", "rank_flags": False},
                       defaults={"slots": 1, "env": {"LAB_TIMEOUT": "20"}}, top={"timeouts": FAST})
    t = time.monotonic()
    assert cr.run("launch", "--detach", inv).returncode == 0
    text = _logs_until(cr, ["connects to localhost:"], 25)
    assert "rendezvous: node1 r1 connects to localhost:" in text, text
    assert time.monotonic() - t < 25
    cr.run("stop", "latest")
