"""scale (issue 37, item 2): every command at 64 and 128 hosts, round after round, none may fail.

Each round runs, as a user would, one after the other (each a new process, spawn → exit):
  launch        `clusterrun launch INV` (attached) of `jobs/stamp.py --sleep 0 --say`; beside it,
                interleaved (which goes first alternates), `launch floor`: the whole-process floor of
                the attached section (a fresh Python, paramiko, a thread per host, the same job)
  ps            `clusterrun ps` (the registry, the newest runs)
  logs          `clusterrun logs RUN` of that launch: every rank's line must be there
  exec          `clusterrun exec INV -- hostname`, every host answering; beside it, interleaved,
                `exec floor` (the same floor running `hostname`)
  stacks        `clusterrun stacks RUN` of a detached run whose ranks sleep (started, untimed, as
                `launch --detach`, every rank running): every rank read
  top --once    `clusterrun top --once RUN` of it: every host sampled
  stop          `clusterrun stop RUN --grace 2` of it: every rank ended in the run record
  clean         `clusterrun clean INV`: the round's two finished runs' folders removed from every host
A round that fails a command records the failure (its message, in the notes) and goes on with the next
command; the table counts failures per command. Round -1 (unrecorded) warms up: first connections, the
host program installed on every host.
"""

from __future__ import annotations

import json
import shlex
from typing import Callable, Dict

from .. import baselines
from ..cluster import HOST_PYTHON
from ..context import HOST_JOBS, JOBS, Context
from ..measure import Done, run

SECTION = "scale"
COMMANDS = ("launch", "launch floor", "ps", "logs", "exec", "exec floor", "stacks", "top --once", "stop", "clean")
TIMEOUT = 300


class Failed(Exception):
    """One command of one round did not do what it must."""


def run_section(ctx: Context, reps: int) -> None:
    bench = Scale(ctx)
    ctx.install_host_jobs()
    for rep in range(-1, reps):
        bench.round(rep)
        if rep >= 0:
            ctx.log(f"  scale {ctx.n} round {rep + 1}/{reps}: " + ", ".join(
                f"{c} {_last(ctx, ctx.n, c)}" for c in COMMANDS))
    for command, count in bench.failures.items():
        if count:
            ctx.rec.note(SECTION, ctx.n, f"{command}: {count} of {reps} rounds failed")
    ctx.check_no_leftovers(SECTION)


class Scale:
    """The commands of one round, each checked; state (the round's run ids) in self.state."""

    def __init__(self, ctx: Context):
        self.ctx, self.n, self.cl = ctx, ctx.n, ctx.cluster
        self.inv = str(self.cl.write_inventory(ctx.work / "scale.json", root=JOBS, script="stamp.py", grace="2s"))
        self.env = baselines.measured_env()
        self.failures: Dict[str, int] = {}
        self.state: Dict[str, str] = {}

    def round(self, rep: int) -> None:
        tag = f"{SECTION}-{self.n}-{rep if rep >= 0 else 'warmup'}"
        self.state = {}
        first = rep % 2 == 0  # clusterrun before its floor in even rounds, after it in odd ones
        for command in (("launch", "launch floor") if first else ("launch floor", "launch")):
            self.timed(rep, command, lambda c=command: self.launches(c, f"{tag}-{c.replace(' ', '-')}"))
        if "attached" in self.state:
            self.timed(rep, "ps", self.ps)
            self.timed(rep, "logs", self.logs)
        for command in (("exec", "exec floor") if first else ("exec floor", "exec")):
            self.timed(rep, command, self.exec if command == "exec" else self.exec_floor)
        self.timed(rep, "launch --detach", lambda: self.detach(f"{tag}-detached"), record=False)
        if "detached" in self.state:
            self.timed(rep, "stacks", self.stacks)
            self.timed(rep, "top --once", self.top)
            self.timed(rep, "stop", self.stop)
        self.timed(rep, "clean", self.clean)

    def timed(self, rep: int, command: str, fn: Callable[[], Done], record: bool = True) -> None:
        """fn(), its time recorded (rep >= 0); a failure counted, noted with its message, and logged."""
        ctx, n = self.ctx, self.n
        try:
            done = fn()
        except Failed as exc:
            self.failures[command] = self.failures.get(command, 0) + (rep >= 0)
            ctx.rec.note(SECTION, n, f"round {rep + 1}: {command} failed: {exc}"[:700])
            ctx.log(f"  scale {n}: round {rep + 1}: {command} FAILED: {exc}"[:400])
            if rep >= 0 and record:
                ctx.rec.add(SECTION, n, command, "failed", 1, rep, "rounds")
            return
        if rep >= 0 and record:
            ctx.rec.add(SECTION, n, command, "time", done.wall, rep)
            ctx.rec.add(SECTION, n, command, "cpu", done.cpu, rep, "cpu-s")
            ctx.rec.add(SECTION, n, command, "failed", 0, rep, "rounds")

    # the commands ---------------------------------------------------------------------------------
    def clusterrun(self, *args: str) -> Done:
        return _must(run(self.ctx.clusterrun(*args), env=self.ctx.env(), cwd=self.ctx.cwd, timeout=TIMEOUT))

    def launches(self, command: str, tag: str) -> Done:
        if command == "launch":
            done = self.clusterrun("launch", self.inv, "--", "--tag", tag, "--sleep", "0", "--say")
            self.state["attached"] = self.ctx.latest_run()["id"]
        else:
            line = (f"cd ~/{HOST_JOBS} && {HOST_PYTHON} stamp.py --rank {{rank}} --world-size {self.n} "
                    f"{shlex.join(['--tag', tag, '--sleep', '0'])}")
            done = _must(run(baselines.floor(self.cl, line), env=self.env, timeout=TIMEOUT))
        _stamps(self.ctx, tag, "end", self.n)
        return done

    def ps(self) -> Done:
        done = self.clusterrun("ps")
        if self.state["attached"] not in done.outputs[0].decode() + done.errors[0].decode():
            raise Failed(f"the run {self.state['attached']} is not listed")
        return done

    def logs(self) -> Done:
        done = self.clusterrun("logs", self.state["attached"])
        text = done.outputs[0].decode()
        missing = [r for r in range(self.n) if f"rank {r} of {self.n} says hello" not in text]
        if missing:
            raise Failed(f"{len(missing)} ranks' lines missing, e.g. ranks {missing[:8]}")
        return done

    def exec(self) -> Done:
        done = self.clusterrun("exec", self.inv, "--json", "--", "hostname")
        got = _answers(json.loads(done.outputs[0]))
        if got != self.n:
            raise Failed(f"{got} of {self.n} hosts answered")
        return done

    def exec_floor(self) -> Done:
        return _must(run(baselines.floor(self.cl, "hostname"), env=self.env, timeout=TIMEOUT))

    def detach(self, tag: str) -> Done:
        done = self.clusterrun("launch", "--detach", self.inv, "--", "--tag", tag, "--sleep", "600")
        run_id = done.outputs[0].decode().split()[-1]
        try:
            _stamps(self.ctx, tag, "start", self.n)
        except Failed as exc:
            record = self.ctx.latest_run()
            stopped = run(self.ctx.clusterrun("stop", run_id, "--grace", "1"), env=self.ctx.env(), cwd=self.ctx.cwd,
                          timeout=TIMEOUT)  # never left running into the next round
            raise Failed(f"{exc}; the run: {record.get('state')}, {record.get('reason')}; stop exit {stopped.codes}") \
                from None
        self.state["detached"] = run_id
        return done

    def stacks(self) -> Done:
        done = self.clusterrun("stacks", self.state["detached"], "--json")
        doc = json.loads(done.outputs[0])
        ranks = _stack_ranks(doc)
        if ranks != self.n:
            odd = [f"r{r['rank']} {r.get('state')} via {r.get('via')}: {r.get('error')}" for r in doc["ranks"]
                   if not r.get("threads") or r.get("error")]
            raise Failed(f"{ranks} of {self.n} ranks' stacks read; unreachable {doc.get('unreachable')}; "
                         + "; ".join(odd[:6]))
        return done

    def top(self) -> Done:
        done = self.clusterrun("top", "--once", "--json", self.state["detached"])
        doc = json.loads(done.outputs[0])
        sampled = _top_hosts(doc)
        if sampled != self.n:
            odd = [f"{h['name']}: {h.get('error')}" for h in doc["hosts"] if h.get("error")]
            raise Failed(f"{sampled} of {self.n} hosts sampled; " + "; ".join(odd[:6]))
        return done

    def stop(self) -> Done:
        done = self.clusterrun("stop", self.state["detached"], "--grace", "2")
        record = self.ctx.latest_run()
        ended = [r for r in record["ranks"] if r.get("ended_at") is not None]
        if record["id"] == self.state["detached"] and len(ended) != self.n:
            raise Failed(f"{len(ended)} of {self.n} ranks ended after stop (state {record.get('state')})")
        return done

    def clean(self) -> Done:
        return self.clusterrun("clean", self.inv)


def _must(done: Done) -> Done:
    if not done.ok:
        raise Failed(f"exit {done.codes}: {_words(done)}")
    return done


def _words(done: Done) -> str:
    """The last lines of a failed command's output that say something (a table's borders say nothing)."""
    text = b"\n".join(e or b"" for e in done.errors + done.outputs).decode("utf-8", "replace")
    lines = [line.strip(" │─┌┐└┘├┤┬┴┼╭╮╰╯") for line in text.splitlines()]
    return " / ".join(line for line in lines if sum(c.isalnum() for c in line) > 3)[-600:]


def _stamps(ctx: Context, tag: str, prefix: str, n: int) -> None:
    try:
        ctx.wait_stamps(tag, prefix, n, timeout=60)
    except RuntimeError as exc:
        raise Failed(str(exc)) from None


def _last(ctx: Context, n: int, command: str) -> str:
    values = ctx.rec.values(SECTION, n, command, "failed")
    if values and values[-1]:
        return "FAILED"
    times = ctx.rec.values(SECTION, n, command, "time")
    return f"{times[-1]:.2f}s" if times else "-"


def _answers(doc: list) -> int:
    """Hosts that exited 0 in `exec --json` (a list: host, exit_code, stdout, ...)."""
    return sum(1 for a in doc if a.get("exit_code") == 0 and a.get("stdout", "").strip())


def _stack_ranks(doc: dict) -> int:
    """Ranks whose stacks `stacks --json` read (threads, no error), none of the hosts unreachable."""
    return 0 if doc.get("unreachable") else sum(1 for r in doc["ranks"] if r.get("threads") and not r.get("error"))


def _top_hosts(doc: dict) -> int:
    """Hosts `top --once --json` sampled (no error)."""
    return sum(1 for h in doc["hosts"] if not h.get("error"))
