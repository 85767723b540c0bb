"""Timing primitives: run commands with wall time, controller CPU and wire bytes; samples; statistics.

Controller CPU is the user+system time of the measured processes and their descendants, from
getrusage(RUSAGE_CHILDREN) deltas around the wait: the bench runs one measurement at a time and
reaps nothing else meanwhile, so the delta belongs to that measurement alone.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Done:
    t0: float           # epoch seconds just before the first spawn (comparable with the hosts' stamps)
    t_end: float        # epoch seconds when the last process had exited
    wall: float         # seconds, monotonic
    cpu: float          # CPU seconds of the processes and their children
    codes: List[int]
    net_tx: int = 0     # bytes to the hosts through the cluster's bridge
    hosts_cpu: float = float("nan")  # CPU seconds of every process on the hosts (their containers)
    outputs: List[bytes] = field(default_factory=list)
    errors: List[bytes] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    def describe_failure(self) -> str:
        parts = []
        for code, err, out in zip(self.codes, self.errors, self.outputs or [b""] * len(self.codes)):
            if code:
                text = (err or b"").decode("utf-8", "replace").strip() or (out or b"").decode("utf-8", "replace")
                parts.append(f"exit {code}: {text[-600:]}")
        return "; ".join(parts)


def run_parallel(argvs: Sequence[Sequence[str]], *, env: Optional[dict] = None, cwd: Optional[str] = None,
                 timeout: float = 600, net: Optional[Callable[[], Dict[str, int]]] = None,
                 capture: bool = True, on_chunk: Optional[Callable[[int, float, bytes], None]] = None,
                 hosts_cpu: Optional[Callable[[], float]] = None) -> Done:
    """Spawn every argv at once and wait for all; stdout/stderr are drained by threads (never a pipe
    left full: a full pipe would slow the process we time).

    With on_chunk, stdout is handed over as it arrives, (process index, epoch time of arrival, bytes),
    instead of being collected: reads return whatever the pipe holds, so a line printed alone is
    timestamped when it arrives."""
    net0 = net()["tx"] if net else 0
    hcpu0 = hosts_cpu() if hosts_cpu else float("nan")
    cpu0 = _cpu()
    t0 = time.time()
    m0 = time.monotonic()
    procs = [subprocess.Popen(list(a), stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                              stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for a in argvs]
    outs: List[List[bytes]] = [[b"", b""] for _ in procs]
    readers = _drain_all(procs, outs, on_chunk)
    codes = _wait_all(procs, m0 + timeout)
    m1 = time.monotonic()
    t_end = time.time()
    cpu = _cpu() - cpu0
    hcpu = (hosts_cpu() - hcpu0) if hosts_cpu else float("nan")
    for t in readers:
        t.join(5)
    return Done(t0=t0, t_end=t_end, wall=m1 - m0, cpu=cpu, codes=codes, hosts_cpu=hcpu,
                net_tx=(net()["tx"] - net0) if net else 0,
                outputs=[o[0] for o in outs], errors=[o[1] for o in outs])


def _drain_all(procs: List[subprocess.Popen], outs: List[List[bytes]],
               on_chunk: Optional[Callable[[int, float, bytes], None]]) -> List[threading.Thread]:
    """A thread per pipe reading it to its end: into outs[i] ([stdout, stderr]), or stdout to on_chunk."""
    readers = []
    for i, p in enumerate(procs):
        for j, stream in enumerate((p.stdout, p.stderr)):
            if stream is not None:
                cb = (lambda t, data, i=i: on_chunk(i, t, data)) if (on_chunk and j == 0) else None
                t = threading.Thread(target=_drain, args=(stream, outs[i], j, cb), daemon=True)
                t.start()
                readers.append(t)
    return readers


def _wait_all(procs: List[subprocess.Popen], deadline: float) -> List[int]:
    """Every process's exit code; one still running at the deadline (monotonic) is killed."""
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def run(argv: Sequence[str], **kw) -> Done:
    return run_parallel([argv], **kw)


def _drain(stream, box: List[bytes], j: int, on_chunk=None) -> None:
    chunks = []
    for chunk in iter(lambda: stream.read1(1 << 20), b""):
        if on_chunk is not None:
            on_chunk(time.time(), chunk)
        else:
            chunks.append(chunk)
    box[j] = b"".join(chunks)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# ----------------------------------------------------------------------------------------------
# samples and statistics


@dataclass
class Sample:
    section: str
    hosts: int
    method: str
    metric: str
    value: float
    rep: int
    unit: str


class Recorder:
    """Every measured value, one row each; the report derives medians and ratios from these."""

    def __init__(self, path: Optional[str] = None):
        self.samples: List[Sample] = []
        self.notes: List[dict] = []
        self._path = path

    def add(self, section: str, hosts: int, method: str, metric: str, value: float, rep: int,
            unit: str = "s") -> None:
        self.samples.append(Sample(section, hosts, method, metric, float(value), rep, unit))

    def note(self, section: str, hosts: int, text: str) -> None:
        self.notes.append({"section": section, "hosts": hosts, "text": text})

    def values(self, section: str, hosts: int, method: str, metric: str) -> List[float]:
        return [s.value for s in self.samples
                if (s.section, s.hosts, s.method, s.metric) == (section, hosts, method, metric)]

    def to_json(self) -> dict:
        return {"samples": [asdict(s) for s in self.samples], "notes": self.notes}

    def save(self, extra: dict) -> None:
        if self._path:
            tmp = self._path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({**extra, **self.to_json()}, fh, indent=1)
            os.replace(tmp, self._path)


def median(values: Iterable[float]) -> Optional[float]:
    values = list(values)
    return statistics.median(values) if values else None


def percentile(values: Iterable[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (q in 0..100)."""
    values = sorted(values)
    if not values:
        return None
    k = max(0, min(len(values) - 1, int(round(q / 100 * len(values) + 0.5)) - 1))
    return values[k]


def rotate(items: Sequence, rep: int) -> list:
    """The methods' order for repetition `rep`: A B C, B C A, C A B ... so no method always goes first."""
    k = rep % len(items)
    return list(items[k:]) + list(items[:k])
