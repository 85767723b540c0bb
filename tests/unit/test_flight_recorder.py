"""NCCL's Flight Recorder in a hang: the variables a nccl run gets (both spellings, unless env: sets them),
the dumps read back (tests/standin/flight_recorder: four ranks' files in torch's own format, read by
torch's own loader too), who is behind, and a real hang on real supervisors where each rank plays NCCL's
part (a FIFO it watches, a dump written when asked): hang.json and the root cause name the rank behind
and its sequence number."""

import json
import os
import pickle
import shutil
import sys
import time
from pathlib import Path

import pytest

from clusterrun import outcome
from clusterrun.config.inventory import Timeouts, parse_inventory
from clusterrun.hosts.client import HostClient
from clusterrun.plan import build_plan, flight_recorder_env
from clusterrun.remote.host.run import flight
from clusterrun.remote.host.words import behind_text
from clusterrun.transport.local import LocalTransport
from hostkit import make_host, project, spec
from support import inventory_text, wait_for, write_tree

DUMPS = Path(__file__).resolve().parents[1] / "standin" / "flight_recorder"
BEHIND = "ranks 0-2 at all_reduce #640 (started); rank 3 behind at all_reduce #639 (completed)"


def test_a_nccl_run_gets_the_flight_recorder_in_both_spellings_into_its_run_folder(tmp_path):
    write_tree(tmp_path, {"job.py": "print(1)\n"})

    def env_of(job, host_env=None):
        inv = parse_inventory(inventory_text([{"name": "a", "host": "10.0.0.1", "gpus": [0],
                                               **({"env": host_env} if host_env else {})}],
                                             {"script": "job.py", **job}), str(tmp_path / "inv.yaml"))
        return build_plan(inv, "20261202-120000-abcd").nodes[0].ranks[0].env

    env = env_of({"backend": "nccl"})
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == \
        "~/.clusterrun/runs/20261202-120000-abcd/nccl_trace_rank_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "~/.clusterrun/runs/20261202-120000-abcd/nccl_trace_pipe_rank_"
    mine = env_of({"backend": "nccl"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"})  # the old spelling: the pair is theirs
    assert mine["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and "TORCH_FR_BUFFER_SIZE" not in mine
    assert mine["TORCH_FR_DUMP_TEMP_FILE"].endswith("/nccl_trace_rank_")
    assert not any(k.startswith("TORCH_FR") or k.startswith("TORCH_NCCL") for k in env_of({"backend": "gloo"}))
    assert flight_recorder_env("nccl", "/w/runs/R", {"TORCH_FR_DUMP_TEMP_FILE": "/x/"})["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_torchs_own_loader_reads_the_fixture():
    loader = pytest.importorskip("torch.distributed.flight_recorder.components.loader")
    got = loader.read_dump("nccl_trace_rank_", str(DUMPS / "nccl_trace_rank_3"))
    assert got["rank"] == 3 and got["version"] == "2.10" and got["entries"][-1]["collective_seq_id"] == 639


def test_each_ranks_last_collective_and_who_is_behind():
    lasts, errors = flight.read_all(str(DUMPS))
    assert errors == {} and sorted(lasts) == [0, 1, 2, 3]
    assert lasts[0] == {"seq": 640, "op": "all_reduce", "state": "started", "group": "0",
                        "where": "c10d.py:2501 in all_reduce"}
    assert lasts[3]["seq"] == 639 and lasts[3]["state"] == "completed"
    assert behind_text(lasts) == BEHIND
    assert behind_text(lasts, {3: "node3"}).endswith("rank 3 (node3) behind at all_reduce #639 (completed)")
    assert behind_text({r: lasts[0] for r in range(4)}) == ""  # all at the same place: NCCL cannot tell


def test_a_dump_with_anything_but_builtin_types_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"not a pickle")
    lasts, errors = flight.read_all(str(tmp_path))
    assert lasts == {} and "builtin types only, not posix.system" in errors[0] and "not a Flight Recorder" in errors[1]


def test_ranks_are_asked_through_their_pipes(tmp_path):
    """What torch does with TORCH_NCCL_DEBUG_INFO_PIPE_FILE: a FIFO per rank; a write into it, a dump."""
    import threading

    pipe = tmp_path / "nccl_trace_pipe_rank_2.pipe"
    os.mkfifo(pipe)

    def nccl():
        with open(pipe, "rb") as fh:
            fh.read(1)
        shutil.copy(DUMPS / "nccl_trace_rank_2", tmp_path / "nccl_trace_rank_2")
    t = threading.Thread(target=nccl, daemon=True)
    t.start()
    wait_for(lambda: t.is_alive(), timeout=5)
    time.sleep(0.2)  # its open() blocks until a writer comes: the reader is there
    got = flight.evidence(str(tmp_path), [1, 2], "node1")
    assert got["asked"] == [2] and got["ranks"]["2"]["seq"] == 640 and got["cause"] == ""


# ------------------------------------------------------------------ a real hang, real supervisors

JOB = """\
import os, select, shutil, sys, threading, time
rank = int(sys.argv[1])
pipes = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + "%d.pipe"
os.mkfifo(pipes % rank)
reader = os.open(pipes % rank, os.O_RDONLY | os.O_NONBLOCK)  # read from now on: an ask finds it open

def flight_recorder():  # NCCL's part: a dump of this rank's collectives when its pipe is written
    select.select([reader], [], [])
    shutil.copy(os.path.join(sys.argv[2], "nccl_trace_rank_%d" % rank),
                os.environ["TORCH_FR_DUMP_TEMP_FILE"] + "%d" % rank)

threading.Thread(target=flight_recorder, daemon=True).start()
while not all(os.path.exists(pipes % r) for r in range(4)):  # the hang clock runs from the last word: a
    time.sleep(0.01)  # slow start of one rank (a loaded machine) must not leave it out of the ask
print("rank", rank, "started", flush=True)

def load_batch():
    time.sleep(120)

def all_reduce():
    while True:
        time.sleep(0.05)

load_batch() if rank == 3 else all_reduce()
"""


def test_a_hang_names_the_rank_behind_and_its_sequence_number(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{DUMPS.parent / 'gpu'}{os.pathsep}{os.environ['PATH']}")  # the stand-in nvidia-smi
    c = HostClient(make_host(tmp_path / "w"), LocalTransport("node3"), Timeouts(command=20))
    run = "20261202-000000-0fr0"
    c.push(run, project(tmp_path, {"job.py": JOB.encode()}), hold=False)
    folder = tmp_path / "w" / "runs" / run
    job = folder / "job" / "job.py"
    s = spec(run, [(r, [sys.executable, str(job), str(r), str(DUMPS)]) for r in range(4)], grace=1.0,
             hang_timeout=2.0, node="node3", uses_gpus=True)
    for r in s["ranks"]:
        r["env"].update(flight_recorder_env("nccl", str(folder), {}))
    try:
        c.start(run, s)
        wait_for(lambda: (folder / "done.json").exists(), timeout=40, every=0.1, what="the hung run's end")
    finally:
        c.stop(run, 0.5)
    hang = json.loads((folder / "stacks" / "hang.json").read_text())
    assert hang["nccl"]["asked"] == [0, 1, 2, 3]
    assert {r: v["seq"] for r, v in hang["nccl"]["ranks"].items()} == {"0": 640, "1": 640, "2": 640, "3": 639}
    assert hang["nccl"]["cause"] == ("ranks 0-2 at all_reduce #640 (started); rank 3 (node3) behind at all_reduce "
                                     "#639 (completed)")
    assert hang["gpus"] == {"gpus": [{"index": 0, "util_pct": 97.0, "used_mib": 4.0, "total_mib": 81920.0},
                                     {"index": 1, "util_pct": 0.0, "used_mib": 4.0, "total_mib": 81920.0}]}
    records = {r: json.loads((folder / f"rank-{r}.exit").read_text()) for r in range(4)}
    assert records[3]["nccl"]["seq"] == 639
    ranks = [outcome.RankResult.from_exit(r, 0, "node3", info, clock_offset=0.0) for r, info in records.items()]
    result = outcome.decide("run", ranks)
    assert result.reason.startswith("hung: no output for 2s; NCCL: ranks 0-2 at all_reduce #640 (started); "
                                    "rank 3 (node3) behind at all_reduce #639 (completed); stacks: rank 3 on node3 "
                                    "in load_batch (job.py:"), result.reason
    assert result.root_cause.rank == 3
