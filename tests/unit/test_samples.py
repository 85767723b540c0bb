"""`top`'s samples as records (clusterrun/runs/samples.py): a host's line read once with `from_wire`; a field
that is missing or of the wrong type reads as None and is shown as "-", never a crash in the view."""

import json

import pytest
from rich.console import Console

from clusterrun.hosts.claims import Holder
from clusterrun.runs.samples import GpuLoad, HostLoad, RankLoad, Sample
from clusterrun.runs.top import TopTarget, stragglers, top_view
from clusterrun.ui.observe import top_renderable
from hostkit import make_host

WIRE = {"now": 1700000000.5, "interval": 2.0,
        "host": {"cpu_pct": 50.5, "cores": 8, "load1": 1.25, "mem_used": 3 << 30, "mem_total": 16 << 30,
                 "net_rx": 1000, "net_tx": 2000,
                 "gpus": [{"index": 0, "util_pct": 45.0, "mem_used": 1 << 30, "mem_total": 80 << 30}]},
        "ranks": [{"rank": 1, "state": "running", "pid": 42, "cpu_pct": 99.5, "rss": 1 << 20, "rss_children": 0,
                   "children": 0, "last_output_s": 0.5},
                  {"rank": 0, "state": "ended", "last_output_s": 3.0}],
        "runs": ["20261201-000000-0001"],
        "claims": [{"kind": "claim", "user": "alice", "by": "alice@laptop", "run": "20261201-000000-0001",
                    "node": "n0", "slots": 2, "gpus": [0, 1], "since": 1700000000.0, "state": "running",
                    "ticket": [1.0, "a"], "live": True}]}


def render(view) -> str:
    out = Console(width=200, record=True)
    out.print(top_renderable(view))
    return out.export_text()


def test_a_hosts_sample_is_read_into_records():
    s = Sample.from_wire("n0", WIRE)
    assert s.host == HostLoad(50.5, 8, 1.25, 3 << 30, 16 << 30, 1000, 2000, (GpuLoad(0, 45.0, 1 << 30, 80 << 30),))
    assert s.ranks == (RankLoad(1, "running", 42, 99.5, 1 << 20, 0, 0, 0.5), RankLoad(0, "ended", last_output_s=3.0))
    assert s.runs == ("20261201-000000-0001",) and s.now == 1700000000.5 and s.interval == 2.0
    assert s.claims == (Holder.from_wire("n0", WIRE["claims"][0]),) and s.claims[0].gpus == (0, 1)
    # the JSON `top --json` prints: every host field, a rank's measures where the host could tell them
    assert s.host.to_json() == WIRE["host"]
    assert [r.to_json() for r in s.ranks] == [WIRE["ranks"][0], WIRE["ranks"][1]]


def test_missing_fields_read_as_unknown():
    s = Sample.from_wire("n0", {})
    assert s.host == HostLoad() and s.host.gpus is None and s.ranks == () and s.runs == () and s.claims == ()
    assert s.now is None and s.interval is None
    s = Sample.from_wire("n0", {"host": {"cpu_pct": 12.0}, "ranks": [{"rank": 3}]})
    assert s.host.cpu_pct == 12.0 and s.host.mem_total is None
    assert s.ranks == (RankLoad(3),) and not s.ranks[0].running and s.ranks[0].to_json() == {"rank": 3, "state": ""}
    assert GpuLoad.from_wire({}, 2) == GpuLoad(2)  # no index: its place in the list


def test_wrong_types_read_as_unknown_and_unreadable_entries_are_left_out():
    odd = {"now": "later", "interval": None,
           "host": {"cpu_pct": "50", "cores": 2.5, "load1": True, "mem_used": [1], "mem_total": None, "net_rx": "x",
                    "net_tx": {}, "gpus": "none"},
           "ranks": [{"rank": "1", "state": "running"},  # no rank number: nowhere to put it
                     {"rank": 2, "state": 7, "cpu_pct": "hot", "rss": 1.5, "children": "two", "last_output_s": False},
                     "not a rank", None],
           "runs": "20261201-000000-0001",  # not a list
           "claims": [{"slots": "two"}, {"ticket": 5}, "x", {"user": "bob", "run": "r2", "kind": "queue"}]}
    s = Sample.from_wire("n0", odd)
    assert s.host == HostLoad() and s.now is None
    assert s.ranks == (RankLoad(2),)
    assert s.runs == ()
    assert [(c.user, c.run, c.kind) for c in s.claims] == [("bob", "r2", "queue")]
    assert Sample.from_wire("n0", {"host": {"gpus": [{"index": "0", "util_pct": "45"}, 3]}}).host.gpus == \
        (GpuLoad(0), GpuLoad(1))
    assert Sample.from_wire("n0", {"host": [], "ranks": {}, "claims": {}}).host == HostLoad()


def test_a_line_that_is_not_a_sample_is_a_clear_error():
    for line in ([], "text", None, 3):
        with pytest.raises(ValueError, match="n0: a sample that is not a JSON object"):
            Sample.from_wire("n0", line)


def test_the_view_of_odd_samples_renders_and_dumps():
    here, there, alone = make_host("/w"), make_host("/v"), make_host("/u")
    from dataclasses import replace

    there, alone = replace(there, name="there"), replace(alone, name="alone")
    odd = Sample.from_wire("here", {"host": {"cpu_pct": "?", "gpus": [{}]},
                                    "ranks": [{"rank": 0, "state": None, "children": 2}, {"rank": 1}]})
    claims = Sample.from_wire("alone", {"claims": [{"user": "bob", "run": "r2", "kind": "queue", "ticket": [2, "b"]},
                                                   {"user": "eve", "run": "r3", "kind": "queue", "ticket": [1, "e"]},
                                                   {"user": "al", "run": "r1", "slots": 1, "gpus": "auto"}],
                                        "runs": ["r1", "r9/attempt-2"]})
    view = top_view("R", [TopTarget(here, "R"), TopTarget(there, "R")], {"here": odd, "there": "unreachable: gone"})
    text = render(view)
    assert "here" in text and "unreachable: gone" in text and "-/-" in text, text
    doc = json.loads(json.dumps(view.to_json()))
    assert doc["hosts"][0]["cpu_pct"] is None and doc["hosts"][0]["gpus"] == [{"index": 0, "util_pct": None,
                                                                               "mem_used": None, "mem_total": None}]
    assert doc["hosts"][1] == {"name": "there", **HostLoad().to_json(), "error": "unreachable: gone"}
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["ranks"][0]["children"] == 2
    inv = top_view("", [TopTarget(alone, "-")], {"alone": claims})
    text = render(inv)
    # waiters numbered by their tickets; a claim's GPUs only when it names indices; runs without a claim too
    assert "al: r1 1 slot " in text and "GPUs auto" not in text, text
    assert "eve waits #1: r3" in text and "bob waits #2: r2" in text, text
    assert "r9/attempt-2" in text and text.count("r1") == 1, text
    assert [c["run"] for c in inv.to_json()["hosts"][0]["claims"]] == ["r2", "r3", "r1"]


def test_stragglers_pass_over_ranks_that_do_not_run_or_say_nothing():
    ranks = [RankLoad(0, "running", cpu_pct=98.0), RankLoad(1, "running", cpu_pct=97.0),
             RankLoad(2, "running", cpu_pct=3.0), RankLoad(3, "running"), RankLoad(4, "ended", cpu_pct=0.0)]
    assert stragglers(ranks) == {2: "CPU 3% where the others use ~98%"}
    assert stragglers([RankLoad(i, "running") for i in range(4)]) == {}


def test_ended_ranks_are_not_silent_and_the_straggler_column_is_named():
    """`top --once` of an ended run said "silent 24 s" for ranks that had simply exited, under a column with
    no header (issue 36)."""
    here = make_host("/w")
    ended = Sample.from_wire("here", {"ranks": [{"rank": 0, "state": "ended", "last_output_s": 24.0},
                                                {"rank": 1, "state": "running", "last_output_s": 3.0}]})
    text = render(top_view("R", [TopTarget(here, "R")], {"here": ended}))
    row0 = next(line for line in text.splitlines() if "ended" in line)
    assert "24 s" not in row0 and "3 s" in text, text
    assert "straggler" not in text  # no column when no rank stands out
    slow = Sample.from_wire("here", {"ranks": [{"rank": r, "state": "running", "cpu_pct": c, "last_output_s": 1.0}
                                               for r, c in enumerate((98.0, 97.0, 3.0))]})
    text = render(top_view("R", [TopTarget(here, "R")], {"here": slow}))
    assert "straggler" in text, text
    assert "CPU 3% where the others use ~98%" in text


def test_stacks_of_an_ended_run_says_so_with_exit_2():
    """`stacks` of an ended run printed "ranks 0-3: ended / stacks read by nothing" and exited 0 (issue 36)."""
    from types import SimpleNamespace

    from clusterrun.errors import EXIT_USAGE, RunEnded
    from clusterrun.runs.stacks import gather_stacks
    from clusterrun.states import RunState

    record = SimpleNamespace(terminal=True, state=RunState.SUCCEEDED, exit_code=0, ended_at=1764690000.0)
    store = SimpleNamespace(get=lambda run_id: record)
    with pytest.raises(RunEnded) as ended:
        gather_stacks(store, "r1", connect=None)
    assert ended.value.exit_code == EXIT_USAGE
    assert "run r1 ended at " in str(ended.value) and "(succeeded, exit 0): no rank runs" in str(ended.value)
    assert "clusterrun logs r1" in str(ended.value)
