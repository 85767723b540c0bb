"""`clusterrun sweep`: the classic cluster-training experiments as a grid of ordinary runs.

Every point (nodes x batch size x init method x data size x repeat) is a normal run in the registry, on
the first n hosts of the inventory. The results folder keeps `sweep.json` (the grid and each point's
state), so re-running the same sweep skips the points already done.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from ..config.inventory import Inventory
from ..errors import ClusterrunError, UsageError
from ..outcome import launch_failed
from ..states import RunState

STATE_FILE = "sweep.json"
STATE_VERSION = 1


@dataclass(frozen=True)
class Point:
    nodes: int
    batch_size: int
    init_method: str
    data_size: Optional[int]
    repeat: int

    @property
    def key(self) -> str:
        data = f"-d{self.data_size}" if self.data_size is not None else ""
        return f"n{self.nodes}-b{self.batch_size}-{self.init_method}{data}-r{self.repeat}"


def grid(nodes: Sequence[int], batch_sizes: Sequence[int], init_methods: Sequence[str],
         data_sizes: Sequence[Optional[int]], repeat: int) -> List[Point]:
    """Every combination, repeats innermost-last so a short sweep covers the grid once before repeating."""
    return [Point(n, b, m, d, r) for r, n, b, m, d in
            itertools.product(range(repeat), nodes, batch_sizes, init_methods, data_sizes)]


def check_grid(inv: Inventory, nodes: Sequence[int], init_methods: Sequence[str]) -> None:
    too_many = [n for n in nodes if n > len(inv.hosts)]
    if too_many:
        raise UsageError(f"--nodes {max(too_many)}: the inventory has only {len(inv.hosts)} hosts")
    if any(n < 1 for n in nodes):
        raise UsageError("--nodes: every value must be at least 1")
    bad = [m for m in init_methods if m not in ("env", "tcp", "file")]
    if bad:
        raise UsageError(f"--init-method {bad[0]}: choose from env, tcp, file")
    if "file" in init_methods and not inv.job.shared_dir:
        raise UsageError(f"{inv.path}: --init-method file needs job.shared_dir (a folder every host shares)")


def point_inventory(inv: Inventory, point: Point, job_args: Sequence[str]) -> Inventory:
    """The inventory of one point: the first n hosts, the init method, and the job's flags."""
    args = list(job_args) + ["--batch-size", str(point.batch_size)]
    if point.data_size is not None:
        args += ["--data-size", str(point.data_size)]
    return replace(inv, hosts=inv.hosts[:point.nodes],
                   job=replace(inv.job, init_method=point.init_method, args=tuple(args)))


def sweep_id(inv: Inventory, points: Sequence[Point], job_args: Sequence[str]) -> str:
    """What makes two sweeps the same one: hosts, job and grid (so resuming never mixes experiments)."""
    spec = {"hosts": [(h.name, h.host, h.slots) for h in inv.hosts], "script": inv.job.script,
            "args": list(job_args), "points": [p.key for p in points]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class SweepState:
    """sweep.json in the results folder, rewritten atomically after every point."""

    def __init__(self, folder: str, ident: str, points: Sequence[Point]):
        self.folder = folder
        self.path = os.path.join(folder, STATE_FILE)
        self.ident = ident
        self.points: Dict[str, dict] = {}
        if os.path.exists(self.path):
            with open(self.path) as fh:
                data = json.load(fh)
            if data.get("sweep") != ident:
                raise UsageError(f"{self.path} belongs to another sweep (other hosts, job or grid); "
                                 "use another --out folder")
            self.points = data.get("points", {})
        for p in points:
            self.points.setdefault(p.key, {"point": asdict(p), "status": "pending"})

    def done(self, point: Point) -> bool:
        return self.points[point.key]["status"] == "succeeded"

    def record(self, point: Point, **fields) -> None:
        self.points[point.key].update(fields)
        self.save()

    def save(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump({"version": STATE_VERSION, "sweep": self.ident, "points": self.points}, fh, indent=2)
        os.replace(tmp, self.path)


class PointStatus(str, Enum):
    """Where a point of the sweep stands (sweep.json keeps the value)."""

    STARTING = "starting"
    SUCCEEDED = "succeeded"  # the run succeeded and rank 0's metrics were fetched
    FAILED = "failed"
    SKIPPED = "skipped"  # done in an earlier invocation of the same sweep
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PointEvent:
    point: Point
    index: int
    total: int
    status: PointStatus
    run_id: str = ""
    detail: str = ""
    seconds: float = 0.0


RunPoint = Callable[[Point, Inventory], "PointResult"]


@dataclass(frozen=True)
class PointResult:
    run_id: str
    state: RunState  # the run's final state
    exit_code: int
    reason: str
    seconds: float
    metrics: Optional[dict]
    metrics_error: str = ""  # why rank 0's metrics could not be had (unreachable host, not JSON, missing)

    def status(self) -> PointStatus:
        state = RunState(self.state)
        if state is RunState.SUCCEEDED and self.metrics is not None:
            return PointStatus.SUCCEEDED
        return PointStatus.INTERRUPTED if state is RunState.INTERRUPTED else PointStatus.FAILED

    def detail(self) -> str:
        if RunState(self.state) is not RunState.SUCCEEDED:
            return self.reason
        return "" if self.metrics is not None else f"the run succeeded but its metrics: {self.metrics_error}"


def run_sweep(inv: Inventory, points: Sequence[Point], job_args: Sequence[str], state: SweepState,
              run_point: RunPoint, emit: Callable[[PointEvent], None], *, fail_fast: bool = False,
              interrupted: Callable[[], bool] = lambda: False) -> bool:
    """Run the points not done yet, in order. Returns False if it stopped early (fail-fast or Ctrl-C)."""
    total = len(points)
    for i, point in enumerate(points, 1):
        if state.done(point):
            emit(PointEvent(point, i, total, PointStatus.SKIPPED, state.points[point.key].get("run_id", ""),
                            "done before"))
            continue
        if interrupted():
            return False
        emit(PointEvent(point, i, total, PointStatus.STARTING))
        t = time.monotonic()
        try:
            result = run_point(point, point_inventory(inv, point, job_args))
        except ClusterrunError as exc:  # connect or push failed: this point failed, the sweep goes on
            failed = launch_failed("", exc)
            result = PointResult("", failed.state, failed.exit_code, failed.reason.splitlines()[0],
                                 time.monotonic() - t, None)
        status, detail = result.status(), result.detail()
        state.record(point, status=status.value, run_id=result.run_id, seconds=round(result.seconds, 3),
                     exit_code=result.exit_code, reason=detail, metrics=result.metrics)
        emit(PointEvent(point, i, total, status, result.run_id, detail, result.seconds))
        if status is PointStatus.INTERRUPTED or (status is PointStatus.FAILED and fail_fast):
            return False
    return True


def points_in(state: SweepState, points: Iterable[Point]) -> List[dict]:
    return [state.points[p.key] for p in points]


class PointRunner:
    """Runs one point as an ordinary run (registry, logs, teardown) and fetches rank 0's metrics file.
    Each point launches with --wait semantics: on shared hosts it queues behind other people's runs
    (and a point of another sweep), first come first served, instead of failing busy."""

    def __init__(self, *, store, secrets: Dict[str, str], emit: Callable[[object], None], metrics_path: str,
                 hash_cache=None):
        self.store = store
        self.secrets = secrets
        self.emit = emit
        self.metrics_path = metrics_path
        self.hash_cache = hash_cache
        self.current = None
        self.interrupted = False

    def interrupt(self) -> None:
        self.interrupted = True
        if self.current is not None:
            self.current.interrupt()

    def __call__(self, point: Point, inv: Inventory) -> PointResult:
        from ..hosts.client import make_connect
        from ..launch.runner import Runner
        from ..plan import new_run_id

        connect = make_connect(inv.timeouts)
        run_id = new_run_id()
        self.current = Runner(inv, run_id, store=self.store, connect=connect, secrets=self.secrets, emit=self.emit,
                              hash_cache=self.hash_cache, wait=True)
        try:
            outcome = self.current.run()
        finally:
            self.current = None
        metrics, error = None, ""
        if outcome.state is RunState.SUCCEEDED:
            metrics, error = self._metrics(connect, inv, run_id)
        return PointResult(run_id, outcome.state, outcome.exit_code, outcome.reason, outcome.seconds, metrics, error)

    def _metrics(self, connect, inv: Inventory, run_id: str):
        """(rank 0's metrics, "") or (None, why not): the host unreachable, the file missing or not JSON."""
        try:
            client = connect(inv.hosts[0])
        except ClusterrunError as exc:
            return None, f"{inv.hosts[0].name} could not be reached to fetch {self.metrics_path} ({exc})"
        try:
            data = client.read_file(run_id, self.metrics_path)
        except ClusterrunError as exc:
            return None, f"{self.metrics_path} could not be read ({exc})"
        finally:
            client.close()
        try:
            metrics = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            return None, f"{self.metrics_path} is not JSON ({exc})"
        if not isinstance(metrics, dict):
            return None, f"{self.metrics_path} is not a JSON object"
        return metrics, ""
