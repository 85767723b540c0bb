"""What every section needs: the cluster, the recorder, how to call clusterrun, the hosts' stamps."""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .baselines import measured_env
from .cluster import BenchCluster, REPO
from .measure import Recorder, rotate, wait_for

JOBS = Path(__file__).resolve().parent / "jobs"
HOST_JOBS = "benchjob"  # the baselines' copy of bench/jobs on every host (relative to the login's home)


@dataclass
class Context:
    cluster: BenchCluster
    rec: Recorder
    work: Path              # local scratch for this size (inventories, generated trees)
    state: Path             # CLUSTERRUN_HOME of the runs the bench makes
    clusterrun_src: Optional[Path]  # run clusterrun from this source tree instead of the installed one
    quick: bool
    log: Callable[[str], None]
    versus_src: Optional[Path] = None  # --versus REV: clusterrun at REV, a method of its own (`versus`)

    @property
    def n(self) -> int:
        return self.cluster.n

    # clusterrun ---------------------------------------------------------------------------------
    def clusterrun(self, *args: str) -> List[str]:
        return [sys.executable, "-m", "clusterrun", *map(str, args)]

    def env(self, versus: bool = False) -> Dict[str, str]:
        """The measured clusterrun's environment; versus: the one of clusterrun at --versus REV instead."""
        env = dict(measured_env(), CLUSTERRUN_HOME=str(self.state), NO_COLOR="1", CLUSTERRUN_NO_RETENTION="1")
        src = self.versus_src if versus else self.clusterrun_src
        if src:
            env["PYTHONPATH"] = str(src)
        return env

    def with_versus(self, methods: Sequence[str]) -> Sequence[str]:
        """The section's methods, and `versus` right after clusterrun when --versus is given."""
        if self.versus_src is None:
            return methods
        return tuple(m for name in methods for m in ((name, "versus") if name == "clusterrun" else (name,)))

    @property
    def cwd(self) -> str:
        # never the repository: `python -m` would import the working tree's clusterrun from the cwd
        return str(self.work)

    def latest_run(self) -> dict:
        """The newest run record, as `clusterrun ps --json` shows it (read only, hosts not asked)."""
        from .measure import run

        done = run(self.clusterrun("ps", "--json", "-n", "1", "--no-reconcile"), env=self.env(), cwd=self.cwd,
                   timeout=60)
        if not done.ok:
            raise RuntimeError(f"clusterrun ps failed: {done.describe_failure()}")
        return json.loads(done.outputs[0])[0]

    def interleave(self, section: str, methods: Sequence[str], reps: int, one: Callable[[str, int], None]) -> None:
        """Every method once unrecorded (rep -1: first connections, caches, the host program's install), then
        `reps` rounds, each running every method once in a rotating order (A B C, B C A, ...), logged."""
        for method in methods:
            one(method, -1)
        for rep in range(reps):
            for method in rotate(methods, rep):
                one(method, rep)
            self.log(f"  {section} rep {rep + 1}/{reps}: " + ", ".join(
                f"{m} {self.rec.values(section, self.n, m, 'time')[-1]:.2f}s" for m in methods))

    # stamps the jobs write under /shared/bench/<tag>/ ---------------------------------------------
    def stamp_dir(self, tag: str) -> Path:
        return self.cluster.shared / "bench" / tag

    def stamps(self, tag: str, prefix: str) -> Dict[int, float]:
        out = {}
        d = self.stamp_dir(tag)
        if not d.is_dir():
            return out
        for p in d.iterdir():
            if p.name.startswith(prefix + "-"):
                out[int(p.name[len(prefix) + 1:])] = float(p.read_text())
        return out

    def stamp(self, tag: str, name: str) -> Optional[float]:
        p = self.stamp_dir(tag) / name
        return float(p.read_text()) if p.exists() else None

    def wait_stamps(self, tag: str, prefix: str, count: int, timeout: float = 60) -> Dict[int, float]:
        ok = wait_for(lambda: len(self.stamps(tag, prefix)) >= count, timeout, interval=0.005)
        got = self.stamps(tag, prefix)
        if not ok:
            raise RuntimeError(f"{tag}: {len(got)} of {count} '{prefix}' stamps after {timeout:g} s")
        return got

    def clear_stamps(self) -> None:
        shutil.rmtree(self.cluster.shared / "bench", ignore_errors=True)

    # the baselines' copy of the jobs on every host ------------------------------------------------
    def install_host_jobs(self) -> None:
        src = self.cluster.shared / "benchjobs"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(JOBS, src, ignore=shutil.ignore_patterns("__pycache__"))
        self.cluster.on_all(f"mkdir -p ~/{HOST_JOBS} && cp /shared/benchjobs/*.py ~/{HOST_JOBS}/")

    def check_no_leftovers(self, section: str, settle: float = 3.0) -> int:
        """Processes of the test user still on the hosts after a section: noted, then killed."""
        deadline = time.monotonic() + settle
        left = self.cluster.leftovers()
        while left and time.monotonic() < deadline:
            time.sleep(0.3)
            left = self.cluster.leftovers()
        if left:
            self.rec.note(section, self.n, f"{len(left)} processes left on the hosts after the section "
                                            f"(killed): " + "; ".join(str(p) for p in left[:5]))
            self.cluster.kill_leftovers()
        return len(left)


def repo_commit() -> Dict[str, str]:
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "clusterrun_dirty": bool(git("status", "--porcelain", "--", "clusterrun"))}
