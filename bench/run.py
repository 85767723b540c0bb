"""Run the benchmarks: clusterrun and the usual ways, side by side, on the container cluster.

    .venv/bin/python bench/run.py --hosts 4,8,16 --reps 5          # the full run (~35 min on 2 cores)
    .venv/bin/python bench/run.py --quick                          # 4 hosts, 2 repetitions (a few minutes)
    .venv/bin/python bench/run.py --hosts 4 --only launch,push     # some sections
    .venv/bin/python bench/run.py --hosts 1,4,8,16 --reps 2 --only relay --docs   # relay push, capped links

Results: bench/results/<stamp>/{results.json, results.md, plot.png, profile-*}; --docs also writes
docs/bench.md and docs/bench.png. See bench/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # `python bench/run.py`: import from the repository, not from bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    __package__ = "bench"

from bench import report  # noqa: E402
from bench.cluster import NAME, REPO, SUBNET, BenchCluster  # noqa: E402
from bench.context import Context, repo_commit  # noqa: E402
from bench.measure import Recorder  # noqa: E402
from bench.sections import exec as exec_section  # noqa: E402
from bench.sections import (attached, claims, hostcpu, launch, logs, profile, pull, push, relay,  # noqa: E402
                            restarts, scale, stacks, teardown, training)

SECTIONS = ("attached", "launch", "push", "logs", "teardown", "training", "profile", "exec", "restarts", "relay", "pull",
            "stacks", "claims", "hostcpu", "scale")
# by name only (--only scale): every command at 64 and 128 hosts, 10 rounds each, is a run of its own
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s != "scale")
TRAINING_HOSTS = 4  # more ranks than this machine's cores would measure its scheduler, not the launcher
# sections that move a lot of data or run long per host: measured up to --heavy-max hosts only, so one run can
# take the launch sections to 64 hosts without pushing 100 MB to each of them
HEAVY = ("push", "logs", "teardown", "pull", "profile", "exec", "stacks")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--hosts", default="4,8,16", help="cluster sizes, one after another (default 4,8,16)")
    p.add_argument("--reps", default="5", help="repetitions; one number, or one per size (5,5,3)")
    p.add_argument("--only", default=",".join(DEFAULT_SECTIONS),
                   help=f"sections ({','.join(SECTIONS)}; all but scale by default)")
    p.add_argument("--quick", action="store_true", help="4 hosts, 2 repetitions, smaller logs, no profile")
    p.add_argument("--train-reps", type=int, default=3)
    p.add_argument("--delay-reps", type=int, default=3)
    p.add_argument("--log-lines", type=int, default=1_000_000, help="flood: lines from all ranks together")
    p.add_argument("--ticks", type=int, default=8, help="delay: lines per rank, one a second")
    p.add_argument("--push-mb", type=int, default=100)
    p.add_argument("--push-files", type=int, default=1000)
    p.add_argument("--heavy-max", type=int, default=16,
                   help=f"the heavy sections ({', '.join(HEAVY)}) only up to this many hosts (default 16)")
    p.add_argument("--relay-caps", default="1000,200", help="relay: the controller link's caps in Mbit/s (default 1000,200)")
    p.add_argument("--at", metavar="REV", help="benchmark clusterrun/ as committed at REV (e.g. HEAD), exported "
                   "to a temporary folder: edits made meanwhile do not leak into the run")
    p.add_argument("--clusterrun-src", type=Path, help="run clusterrun from this source tree (default: installed)")
    p.add_argument("--versus", metavar="REV", help="attached and hostcpu: also clusterrun as committed at REV, as a "
                   "method of its own (`versus`) interleaved with the others: a change's effect, paired")
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<stamp>)")
    p.add_argument("--docs", action="store_true", help="also write docs/bench.md and docs/bench.png")
    p.add_argument("--keep-cluster", action="store_true", help="leave the last cluster up")
    p.add_argument("--cluster-name", default=NAME, help=f"the bench cluster's name (default {NAME})")
    p.add_argument("--subnet", default=SUBNET, help=f"its subnet in 198.18.0.0/15 (default {SUBNET})")
    a = p.parse_args(argv)
    if a.quick:
        a.hosts, a.reps, a.train_reps, a.delay_reps = "4", "2", 1, 1
        a.log_lines, a.ticks = min(a.log_lines, 400_000), min(a.ticks, 5)
        if a.only == ",".join(DEFAULT_SECTIONS):
            a.only = ",".join(s for s in DEFAULT_SECTIONS if s != "profile")
    a.host_list = [int(h) for h in a.hosts.split(",")]
    reps = [int(r) for r in a.reps.split(",")]
    if len(reps) not in (1, len(a.host_list)):
        p.error("--reps: one number, or one per size in --hosts")
    a.rep_list = reps * len(a.host_list) if len(reps) == 1 else reps
    a.sections = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = set(a.sections) - set(SECTIONS)
    if unknown:
        p.error(f"--only: unknown sections {', '.join(sorted(unknown))}")
    return a


def _version(argv) -> str:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (cp.stdout + cp.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


def export(rev: str) -> tuple:
    """clusterrun/ at REV into a temporary folder; (folder, short commit)."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix=f"crbench-src-{commit}-"))
    archive = subprocess.run(["git", "archive", commit, "clusterrun"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder, commit


def describe_source(a: argparse.Namespace) -> str:
    if a.at:
        return f"at commit {a.commit}"
    if a.clusterrun_src:
        return f"from {a.clusterrun_src}"
    git = repo_commit()
    return f"working tree at {git['commit']}" + (" with clusterrun/ modified" if git["clusterrun_dirty"] else "")


def meta(a: argparse.Namespace, argv) -> dict:
    import paramiko

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "python bench/run.py " + shlex.join(argv),
        "hosts": a.host_list, "reps": dict(zip(map(str, a.host_list), a.rep_list)),
        "reps_text": "/".join(str(r) for r in a.rep_list) + (f" (hosts {a.hosts})" if len(set(a.rep_list)) > 1 else ""),
        "clusterrun": describe_source(a),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Linux {platform.release()}",
        "load_at_start": os.getloadavg(),
        "push": {"mb": a.push_mb, "files": a.push_files},
        "cluster": {"name": a.cluster_name, "subnet": a.subnet},
        "tools": {"ssh": _version(["ssh", "-V"]), "pdsh": _version(["pdsh", "-V"]),
                  "rsync": _version(["rsync", "--version"]), "paramiko": paramiko.__version__,
                  "python": platform.python_version()},
    }


def run_one(name: str, ctx: Context, a: argparse.Namespace, hosts: int, reps: int, out: Path,
            profiles: list) -> bool:
    """One section at one size; False when it does not apply to this size."""
    if name in ("training", "restarts") and hosts != max((h for h in a.host_list if h <= TRAINING_HOSTS), default=0):
        return False  # at 4 hosts (or the largest size of the run under that)
    if name in HEAVY and hosts > a.heavy_max:
        return False
    if name == "profile":
        if hosts != max(h for h in a.host_list if h <= a.heavy_max):
            return False
        profiles += profile.run_section(ctx, out, a.push_mb, a.push_files, a.log_lines)
        return True
    sections = {
        "attached": lambda: attached.run_section(ctx, reps),
        "launch": lambda: launch.run_section(ctx, reps),
        "push": lambda: push.run_section(ctx, reps, a.push_mb, a.push_files),
        "logs": lambda: logs.run_section(ctx, reps, a.log_lines, a.ticks, min(reps, a.delay_reps)),
        "teardown": lambda: teardown.run_section(ctx, reps),
        "training": lambda: training.run_section(ctx, a.train_reps),
        "exec": lambda: exec_section.run_section(ctx, reps),
        "restarts": lambda: restarts.run_section(ctx, reps),
        "relay": lambda: relay.run_section(ctx, reps, a.push_mb, files=100,
                                           caps=tuple(int(c) for c in a.relay_caps.split(","))),
        "pull": lambda: pull.run_section(ctx, reps, a.push_mb, a.push_files),
        "stacks": lambda: stacks.run_section(ctx, reps),
        "claims": lambda: claims.run_section(ctx, reps),
        "hostcpu": lambda: hostcpu.run_section(ctx, reps),
        "scale": lambda: scale.run_section(ctx, reps),
    }
    sections[name]()
    return True


def run_sections(ctx: Context, a: argparse.Namespace, reps: int, out: Path, info: dict, profiles: list,
                 log: Callable[[str], None]) -> None:
    """Every section of --only at this size (ctx.n hosts), the results saved after each."""
    hosts, rec = ctx.n, ctx.rec
    for name in a.sections:
        t = time.monotonic()
        # other work on the machine is the main source of noise: keep its level beside the figures
        info["sizes"][str(hosts)].setdefault("load_before", {})[name] = os.getloadavg()[0]
        try:
            ran = run_one(name, ctx, a, hosts, reps, out, profiles)
        except Exception as exc:  # one broken section must not cost the others
            log(f"{hosts} hosts: {name} FAILED: {exc!r}\n{traceback.format_exc()}")
            rec.note(name, hosts, f"section failed: {exc!r}"[:600])
            ctx.cluster.kill_leftovers()
            ran = True
        if ran:
            log(f"{hosts} hosts: {name} done in {time.monotonic() - t:.0f} s")
        rec.save({"meta": info, "profiles": profiles})


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    out = (a.out or REPO / "bench" / "results" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logfile = open(out / "bench.log", "a")

    def log(text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        print(line, file=sys.stderr, flush=True)
        logfile.write(line + "\n")
        logfile.flush()

    a.commit = None
    if a.at:
        a.clusterrun_src, a.commit = export(a.at)
    versus = export(a.versus) if a.versus else None
    info = meta(a, argv)
    if versus:
        info["versus"] = versus[1]
    info["sizes"] = {}
    rec = Recorder(str(out / "results.json"))
    profiles = []
    signal.signal(signal.SIGTERM, _interrupt)  # unwind like Ctrl-C: the cluster is taken down
    t_start = time.monotonic()
    log(f"results in {out}")
    try:
        for k, (hosts, reps) in enumerate(zip(a.host_list, a.rep_list)):
            cl = BenchCluster(hosts, name=a.cluster_name, subnet=a.subnet)
            log(f"{hosts} hosts: bringing cluster {a.cluster_name} up")
            work = Path(tempfile.mkdtemp(prefix=f"crbench-{hosts}-"))
            try:  # an `up` that fails or is interrupted half way is taken down too
                cl.up()
                info["sizes"][str(hosts)] = {"cluster_up_s": cl.up_seconds}
                ctx = Context(cl, rec, work, out / "state", a.clusterrun_src.resolve() if a.clusterrun_src else None,
                              a.quick, log, versus_src=versus[0] if versus else None)
                ctx.clear_stamps()
                run_sections(ctx, a, reps, out, info, profiles, log)
            finally:
                shutil.rmtree(work, ignore_errors=True)
                if not (a.keep_cluster and k == len(a.host_list) - 1):
                    cl.down()
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
    finally:
        info["duration_s"] = round(time.monotonic() - t_start)
        info["load_at_end"] = os.getloadavg()
        rec.save({"meta": info, "profiles": profiles})
        if a.at:
            shutil.rmtree(a.clusterrun_src, ignore_errors=True)
        if versus:
            shutil.rmtree(versus[0], ignore_errors=True)
    report.render(out, docs=a.docs)
    log(f"done in {time.monotonic() - t_start:.0f} s: {out / 'results.md'}")
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
