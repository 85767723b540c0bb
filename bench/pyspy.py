"""Profiles of the controller: where its CPU goes (py-spy, every thread) and where its wall time goes
(pyinstrument, the main thread: imports, connect, push, start).

py-spy runs with --gil: only the thread holding the GIL is sampled, i.e. Python code actually running.
(Without it, py-spy's idle detection does not work in this container and threads blocked on a socket
or a condition show up as busy.) The raw output is collapsed stacks (flamegraph.pl or speedscope.app
read it); `summarize` turns it into a table of functions by self and total share of the samples.
"""

from __future__ import annotations

import collections
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .measure import Done, run_parallel

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _tool(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


def record_cpu(argv: Sequence[str], out: Path, *, env=None, cwd=None, rate: int = 250,
               timeout: float = 900) -> Done:
    """Run argv under py-spy (GIL holder only); raw collapsed stacks to `out`."""
    cmd = [_tool("py-spy"), "record", "--rate", str(rate), "--gil", "--nonblocking", "--format", "raw",
           "--output", str(out), "--", *argv]
    return run_parallel([cmd], env=env, cwd=cwd, timeout=timeout, on_chunk=lambda i, t, d: None)


def record_wall(module_argv: Sequence[str], out_txt: Path, out_html: Path, *, env=None, cwd=None,
                timeout: float = 900) -> Done:
    """Run `python -m MODULE ARGS` under pyinstrument; text and HTML reports of the main thread."""
    session = out_txt.with_suffix(".pyisession")
    cmd = [sys.executable, "-m", "pyinstrument", "--renderer", "session", "--outfile", str(session),
           "-m", *module_argv]
    done = run_parallel([cmd], env=env, cwd=cwd, timeout=timeout, on_chunk=lambda i, t, d: None)
    if session.exists():
        base = [sys.executable, "-m", "pyinstrument", "--load", str(session)]
        run_parallel([base + ["--renderer", "text", "--outfile", str(out_txt)]], timeout=120)
        run_parallel([base + ["--renderer", "html", "--outfile", str(out_html)]], timeout=120)
        session.unlink()
    return done


def _short(path: str) -> str:
    k = path.find("/clusterrun/")
    if k >= 0:
        return path[k + 1:]
    for marker in ("site-packages/", "/lib/python3.11/"):
        k = path.find(marker)
        if k >= 0:
            return path[k + len(marker):]
    return path


def _key(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{_short(m['file'])}:{m['func']}"


def summarize(raw: Path, top: int = 20) -> Tuple[str, Dict[str, List[Tuple[str, float]]]]:
    """Text report (self and total % of samples per file:function) and the same as data."""
    self_t: Dict[str, int] = collections.Counter()
    total_t: Dict[str, int] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        samples += c
        frames = [_key(f) for f in stack.split(";")]
        self_t[frames[-1]] += c
        for k in set(frames):
            total_t[k] += c
    pct = lambda v: 100.0 * v / max(1, samples)  # noqa: E731
    data = {"samples": samples,
            "self": [(k, pct(v)) for k, v in self_t.most_common(top)],
            "total": [(k, pct(v)) for k, v in total_t.most_common(top * 3)
                      if not k.startswith("<frozen") and "threading.py" not in k
                      and "concurrent/futures" not in k][:top]}
    lines = [f"{samples} samples of Python holding the GIL (py-spy --gil, every thread)", "",
             "self %   function (file:function)"]
    lines += [f"{p:6.1f}   {k}" for k, p in data["self"]]
    lines += ["", "total %  function (file:function); threading, thread-pool and import frames left out"]
    lines += [f"{p:6.1f}   {k}" for k, p in data["total"]]
    return "\n".join(lines) + "\n", data
