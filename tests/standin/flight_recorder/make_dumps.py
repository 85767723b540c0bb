"""Writes this folder's dumps: four ranks' Flight Recorder files in the format torch writes them
(torch/csrc/distributed/c10d/FlightRecorder*.cpp; read by torch/distributed/flight_recorder/components/
loader.py: one pickle per rank named PREFIX + global rank, a dict of builtin types). The hang they show:
ranks 0-2 entered all_reduce #640 and wait in it; rank 3 completed #639 and never reached #640 (its
Python is elsewhere, in its data loader). Run it again to regenerate them: python make_dumps.py"""

import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = 1764676800_000_000_000


def entry(record, seq, state, frames):
    return {"record_id": record, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": T0 + seq * 10 ** 8,
            "input_sizes": [[1024, 1024]], "input_dtypes": ["Float"], "output_sizes": [[1024, 1024]],
            "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": T0 + seq * 10 ** 8 + 5000,
            "time_discovered_completed_ns": None if state != "completed" else T0 + seq * 10 ** 8 + 90000,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False, "frames": frames}


TRAIN = [{"name": "all_reduce", "filename": "/usr/lib/python3/site-packages/torch/distributed/c10d.py", "line": 2501},
         {"name": "train_step", "filename": "/home/cr/job/train.py", "line": 88}]

for rank in range(4):
    last = 639 if rank == 3 else 640
    entries = [entry(i, seq, "completed", TRAIN) for i, seq in enumerate(range(last - 3, last))]
    entries.append(entry(len(entries), last, "completed" if rank == 3 else "started", TRAIN))
    dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                                "last_completed_collective": last if rank == 3 else last - 1}},
            "entries": entries}
    with open(os.path.join(HERE, "nccl_trace_rank_%d" % rank), "wb") as fh:
        pickle.dump(dump, fh, protocol=2)
