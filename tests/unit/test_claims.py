"""Claims on a shared host (remote/host/share/): the admission rule on made-up entries, the folder's
files, liveness by pid and start ticks, GPU selection on canned nvidia-smi output, and a real race of
processes for the same slots."""

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from clusterrun.remote.host.procs import exists, start_ticks
from clusterrun.remote.host.share import gpus as G
from clusterrun.remote.host.share.claims import Claims, Folder, judge
from clusterrun.remote.host.wire import Fail

ME = os.getuid()
NVIDIA_SMI_4 = """0, GPU-5d3c1a2b-0000-0000-0000-000000000000, 3 MiB, 81559 MiB
1, GPU-5d3c1a2b-0000-0000-0000-000000000001, 40210 MiB, 81559 MiB
2, GPU-5d3c1a2b-0000-0000-0000-000000000002, 1 MiB, 81559 MiB
3, GPU-5d3c1a2b-0000-0000-0000-000000000003, 0 MiB, 81559 MiB
"""
NVIDIA_SMI_ODD = """No devices were found
0, GPU-aa, [N/A], [N/A]
 1 , GPU-bb , 12 MiB , 16384 MiB
"""


def entry(kind="claim", run="other", uid=1001, slots=1, gpus=(), state="running", ticket=(1.0, ""), node="n0",
          live=True, gpu_count=None):
    return {"kind": kind, "run": run, "uid": uid, "user": f"u{uid}", "node": node, "slots": slots,
            "gpus": list(gpus) if not isinstance(gpus, str) else gpus, "state": state,
            "ticket": [ticket[0], ticket[1] or run], "live": live, "by": "them@there", "since": 0.0, "pid": 1,
            "gpu_count": gpu_count if gpu_count is not None else (len(gpus) if not isinstance(gpus, str) else 1)}


def req(run="mine", slots=1, gpus=None, ticket=5.0, node="n0", count=None):
    return {"uid": ME, "run": run, "node": node, "slots": slots, "gpus": gpus,
            "gpu_count": count if count is not None else slots, "ticket": [ticket, run]}


HOST4 = G.parse(NVIDIA_SMI_4)


def runs(verdict):
    """A verdict with each entry in it (holders, ahead) named by its run: every value, in one comparison
    (but its sums, which test_a_busy_verdict_carries_its_arithmetic asserts)."""
    return {k: [e["run"] for e in v] if k in ("holders", "ahead") else v for k, v in verdict.items() if k != "sums"}


def test_a_busy_verdict_carries_its_arithmetic():
    """What the run needs, what the host offers, what others hold: the words of a busy launch (issue 36)."""
    assert judge(req(slots=2), [entry(slots=1)], [], capacity=2)["sums"] == \
        {"need": 2, "capacity": 2, "used": 1, "gpus_wanted": 0, "gpus": 0}


# -------------------------------------------------------------- the rule


def test_a_free_host_grants_and_a_full_one_names_who_holds_it():
    assert judge(req(slots=2), [], [], capacity=2) == {"granted": []}
    verdict = judge(req(slots=1), [entry(slots=2)], [], capacity=2)
    assert verdict["blocked"] and [h["run"] for h in verdict["holders"]] == ["other"]
    assert not verdict["retry"]


def test_slots_add_up_to_the_capacity_and_a_big_run_may_have_an_empty_host():
    assert judge(req(slots=1), [entry(slots=1)], [], capacity=2) == {"granted": []}
    assert runs(judge(req(slots=2), [entry(slots=1)], [], capacity=2)) == {"blocked": True, "holders": ['other'], "ahead": [], "position": 1, "retry": False}
    assert judge(req(slots=8), [], [], capacity=2) == {"granted": []}  # alone, larger than the host: it runs


def test_stale_entries_count_for_nothing():
    assert judge(req(slots=2), [entry(slots=2, live=False)], [], capacity=2) == {"granted": []}


def test_the_runs_own_entries_never_block_it():
    mine = entry(run="mine", uid=ME, slots=2, state="kept")
    assert judge(req(slots=2), [mine], [], capacity=2) == {"granted": []}


def test_an_earlier_waiter_comes_first_a_later_one_does_not():
    earlier = entry(kind="queue", run="early", slots=2, state="waiting", ticket=(1.0, ""))
    later = entry(kind="queue", run="late", slots=2, state="waiting", ticket=(9.0, ""))
    verdict = judge(req(slots=2, ticket=5.0), [earlier], [], capacity=2)
    assert verdict["blocked"] and [a["run"] for a in verdict["ahead"]] == ["early"]
    assert verdict["position"] == 2
    assert judge(req(slots=2, ticket=5.0), [later], [], capacity=2) == {"granted": []}


def test_an_earlier_waiter_that_could_not_use_what_is_taken_does_not_hold_it_up():
    """GPUs: a waiter that named GPUs 0,1 (held) does not stop a run that takes 2,3; one that wants any
    GPU does (it could use them)."""
    holder = entry(gpus=[0, 1], slots=2)
    named = entry(kind="queue", run="w", gpus=[0, 1], slots=2, state="waiting", ticket=(1.0, ""))
    anyone = entry(kind="queue", run="w", gpus="any", slots=2, state="waiting", ticket=(1.0, ""), gpu_count=2)
    assert judge(req(slots=2, gpus="auto"), [holder, named], HOST4, capacity=64) == {"granted": [2, 3]}
    assert judge(req(slots=2, gpus="auto"), [holder, anyone], HOST4, capacity=64)["ahead"][0]["run"] == "w"


def test_a_younger_launchs_tentative_claim_is_waited_out_an_older_ones_is_busy():
    younger = entry(slots=2, state="tentative", ticket=(9.0, ""))
    older = entry(slots=2, state="tentative", ticket=(1.0, ""))
    assert judge(req(slots=2, ticket=5.0), [younger], [], capacity=2)["retry"] is True
    assert judge(req(slots=2, ticket=5.0), [older], [], capacity=2)["retry"] is False
    assert judge(req(slots=2, ticket=5.0), [dict(younger, state="held")], [], capacity=2)["retry"] is False


def test_gpus_auto_takes_free_idle_ones_lowest_first_in_index_order():
    # GPU 1 has 40 GB in use by something clusterrun does not know: idle ones first
    assert judge(req(slots=2, gpus="auto"), [], HOST4, capacity=64) == {"granted": [0, 2]}
    assert judge(req(slots=3, gpus="auto"), [entry(gpus=[0])], HOST4, capacity=64) == {"granted": [1, 2, 3]}
    verdict = judge(req(slots=2, gpus="auto"), [entry(gpus=[0, 2, 3])], HOST4, capacity=64)
    assert verdict["blocked"] and verdict["holders"][0]["gpus"] == [0, 2, 3]


def test_gpus_named_must_be_free_and_exist():
    assert judge(req(slots=2, gpus=[2, 3]), [entry(gpus=[0, 1])], HOST4, capacity=64) == {"granted": [2, 3]}
    assert runs(judge(req(slots=2, gpus=[1, 2]), [entry(gpus=[0, 1])], HOST4, capacity=64)) == {"blocked": True, "holders": ['other'], "ahead": [], "position": 1, "retry": False}
    assert "no GPU 7" in judge(req(slots=1, gpus=[7]), [], HOST4, capacity=64)["error"]
    # a pool larger than the ranks: the free ones of it
    assert judge(req(slots=2, gpus=[0, 1, 2, 3]), [entry(gpus=[0])], HOST4, capacity=64) == {"granted": [2, 3]}


def test_fewer_gpus_than_slots_is_an_error_not_busy():
    assert "slots: 5" in judge(req(slots=5, gpus="auto"), [], HOST4, capacity=64)["error"]
    assert "0 GPUs" in judge(req(slots=1, gpus="auto"), [], [], capacity=64)["error"]


def test_two_nodes_of_one_run_on_one_machine_get_different_gpus():
    sibling = entry(run="mine", uid=ME, node="n1", gpus=[0, 2], slots=2)
    assert judge(req(slots=2, gpus="auto", node="n0"), [sibling], HOST4, capacity=64) == {"granted": [1, 3]}


# -------------------------------------------------------------- nvidia-smi


def test_nvidia_smi_output_is_parsed():
    assert [(g["index"], g["used_mib"], g["total_mib"]) for g in HOST4] == [
        (0, 3.0, 81559.0), (1, 40210.0, 81559.0), (2, 1.0, 81559.0), (3, 0.0, 81559.0)]
    odd = G.parse(NVIDIA_SMI_ODD)
    assert [(g["index"], g["uuid"], g["used_mib"]) for g in odd] == [(0, "GPU-aa", None), (1, "GPU-bb", 12.0)]
    assert G.idle(odd[0]) and G.idle(odd[1])


def test_gpu_query_without_nvidia_smi_says_why(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    found, why = G.query()
    assert found == [] and "nvidia-smi" in why


def test_gpu_choice_prefers_what_no_earlier_waiter_named():
    assert G.choose(HOST4, 2, taken=set(), reserved={0, 2}) == [1, 3]
    assert G.choose(HOST4, 2, taken={0, 1, 2}) is None


# -------------------------------------------------------------- the folder and its files


def conf(tmp_path, run, slots=1, capacity=1, ticket=None, **extra):
    return {"dir": str(tmp_path / "claims"), "run": run, "node": "n0", "by": "me@here", "slots": slots,
            "capacity": capacity, "ticket": [ticket or time.time(), run], **extra}


def test_the_folder_is_made_sticky_and_world_writable_and_entries_are_readable_by_all(tmp_path):
    a = Claims(conf(tmp_path, "r1"))
    assert a.admit() == {"granted": []}
    folder = tmp_path / "claims"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777
    (path,) = folder.glob("*.claim")
    assert path.name == f"{ME}-r1-n0.claim" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((folder / ".lock").stat().st_mode) == 0o644
    body = json.loads(path.read_text())
    assert body["pid"] == os.getpid() and body["ticks"] == start_ticks(os.getpid()) and body["state"] == "tentative"


def test_a_folder_anyone_may_empty_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(Fail, match="not sticky"):
        Folder(str(folder)).ensure()
    (tmp_path / "file").write_text("")
    with pytest.raises(Fail, match="not a folder"):
        Folder(str(tmp_path / "file")).ensure()


def test_a_file_whose_name_claims_another_uid_is_ignored(tmp_path):
    Claims(conf(tmp_path, "r1")).admit()
    forged = tmp_path / "claims" / f"{ME + 1}-forged-n0.claim"
    forged.write_text((tmp_path / "claims" / f"{ME}-r1-n0.claim").read_text())
    assert [e["run"] for e in Folder(str(tmp_path / "claims")).entries()] == ["r1"]


def test_a_dead_owners_claim_is_stale_ignored_and_removed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        holder = Claims(conf(tmp_path, "r1"))
        holder.admit()
        holder.set_claim("running", pid=child.pid, ticks=start_ticks(child.pid))
        assert runs(Claims(conf(tmp_path, "r2")).admit(take=False)) == {"blocked": True, "holders": ['r1'], "ahead": [], "position": 1, "retry": False}
    finally:
        child.kill()
        child.wait()
    assert exists(child.pid, None) is False
    assert Claims(conf(tmp_path, "r2")).admit() == {"granted": []}
    assert not (tmp_path / "claims" / f"{ME}-r1-n0.claim").exists()  # ours: removed by the next check


def test_a_reused_pid_does_not_keep_a_claim_alive(tmp_path):
    holder = Claims(conf(tmp_path, "r1"))
    holder.admit()
    holder.set_claim("running", ticks=start_ticks(os.getpid()) + 1)  # same pid, another start time
    assert Claims(conf(tmp_path, "r2")).admit() == {"granted": []}


def test_a_claim_kept_for_the_next_attempt_holds_until_its_time(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    holder = Claims(conf(tmp_path, "r1"))
    holder.admit()
    holder.set_claim("kept", pid=child.pid, ticks=123, keep_until=time.time() + 30)
    assert runs(Claims(conf(tmp_path, "r2")).admit(take=False)) == {"blocked": True, "holders": ['r1'], "ahead": [], "position": 1, "retry": False}
    holder.set_claim("kept", pid=child.pid, ticks=123, keep_until=time.time() - 1)
    assert Claims(conf(tmp_path, "r2")).admit(take=False) == {"granted": []}


def test_queueing_keeps_the_place_in_line(tmp_path):
    holder = Claims(conf(tmp_path, "holder"))
    holder.admit()
    holder.set_claim("held")
    b = Claims(conf(tmp_path, "b", ticket=10.0))
    c = Claims(conf(tmp_path, "c", ticket=20.0))
    assert b.admit(queue=True)["position"] == 1
    assert c.admit(queue=True)["position"] == 2
    Claims(conf(tmp_path, "holder")).release()
    assert runs(c.admit(take=False)) == {"blocked": True, "holders": [], "ahead": ['b'], "position": 2, "retry": False}  # b is ahead of it
    assert b.admit() == {"granted": []}
    b.set_claim("held")
    b.dequeue()
    assert c.admit(take=False)["holders"][0]["run"] == "b"


RACE = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from clusterrun.remote.host.share.claims import Claims
for conf in json.loads(sys.argv[1]):  # one round each, every round in its own folder at its own instant
    while time.time() < conf["at"]:
        pass
    verdict = Claims(conf).admit()
    print(*verdict.keys() & {{"granted", "blocked", "error"}}, flush=True)
time.sleep(0.5)  # this process's claims stay live until every process has checked its last round
"""


def test_launches_at_the_same_instant_cannot_both_win(tmp_path):
    """Eight processes check-and-take the same single slot at the same moment, ten times: one each time.
    The same eight processes race every round (a round's folder and instant of its own), so the test pays for
    eight interpreters, not eighty, and each round's claims stay held by live processes."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = RACE.format(root=root)
    start = time.time() + 1.0  # every process is up and spinning by then
    rounds = [(round_no, start + 0.25 * round_no) for round_no in range(10)]
    procs = [subprocess.Popen([sys.executable, "-c", script, json.dumps([
        dict(conf(tmp_path, f"r{round_no}-{i}", ticket=at), at=at, dir=str(tmp_path / f"claims-{round_no}"))
        for round_no, at in rounds])], stdout=subprocess.PIPE, text=True) for i in range(8)]
    answers = [p.communicate(timeout=30)[0].split() for p in procs]
    assert all(len(a) == 10 for a in answers), answers
    for round_no in range(10):
        assert sorted(a[round_no] for a in answers) == ["blocked"] * 7 + ["granted"], (round_no, answers)


def test_top_of_an_inventory_shows_every_users_live_claims_and_who_waits(tmp_path):
    """`top INVENTORY`: the host's samples carry the claims folder's live entries (stale ones left out),
    and the hosts table names the holder, its slots and GPUs, and the waiters in line."""
    from rich.console import Console

    from clusterrun.runs.samples import Sample
    from clusterrun.runs.top import TopTarget, top_view
    from clusterrun.remote.host.observe.samples import Sampler
    from clusterrun.ui.observe import top_renderable

    holder = Claims(conf(tmp_path, "r1", slots=2, capacity=2, gpus=[0, 1]))
    assert holder.admit() == {"granted": [0, 1]}
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = Claims(conf(tmp_path, "gone", slots=0, capacity=2))
    dead.admit()
    dead.set_claim("running", pid=child.pid, ticks=None)
    waiter = Claims(conf(tmp_path, "r2", ticket=time.time() + 1))
    assert runs(waiter.admit(take=False)) == {"blocked": True, "holders": ['r1'], "ahead": [], "position": 1, "retry": False}
    waiter.enqueue()

    sample = Sampler(str(tmp_path / "w"), None, str(tmp_path / "claims")).take()
    assert sorted((e["kind"], e["run"]) for e in sample["claims"]) == [("claim", "r1"), ("queue", "r2")]
    assert Sampler(str(tmp_path / "w"), None, "").take().get("claims") is None

    class H:
        name = "n0"

    view = top_view("", [TopTarget(H(), "-", str(tmp_path / "claims"))], {"n0": Sample.from_wire("n0", sample)})
    assert [e["run"] for e in view.to_json()["hosts"][0]["claims"]] == [e["run"] for e in sample["claims"]]
    out = Console(width=200, record=True)
    out.print(top_renderable(view))
    text = out.export_text()
    assert "r1 2 slots, GPUs 0,1" in text and "waits #1: r2" in text and "gone" not in text, text
