"""The markdown of a benchmark run: one table per section, how costs scale, the targets, notes, profiles."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

DASH = "–"


class View:
    """Read access to report.summarize()'s nested dict: view(section, hosts, method, metric, stat)."""

    def __init__(self, summary: Dict, versus: Optional[str] = None):
        self.summary = summary
        self.versus = versus  # --versus REV: the commit the `versus` method ran

    def hosts(self, sec: str) -> List[str]:
        return sorted(self.summary.get(sec, {}), key=int)

    def __call__(self, sec: str, h, method: str, metric: str, stat: str = "median") -> Optional[float]:
        try:
            return self.summary[sec][str(h)][method][metric][stat]
        except KeyError:
            return None

    def ratio(self, sec: str, h, name: str, stat: str = "median") -> Optional[float]:
        return self(sec, h, "ratio", name, stat)


def num(v: Optional[float], digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
    return DASH if v is None else f"{v * scale:.{digits}f}{suffix}"


def times(v: Optional[float]) -> str:
    return num(v, 2, suffix="×")


def pct(v: Optional[float], digits: int = 0) -> str:
    return num(v, digits, 100, "%")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + \
        ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""]


def attached(v: View) -> List[str]:
    """The attached launch (issue 26): clusterrun against the whole-process floor, serial ssh and pdsh."""
    rows, cpu_rows = [], []
    for h in v.hosts("attached"):
        t = lambda m, metric="time", h=h: num(v("attached", h, m, metric))  # noqa: E731
        phases = " / ".join(num(v("attached", h, "clusterrun", f"phase_{p}")) for p in ("connect", "push", "start"))
        rows.append([h, t("clusterrun"), t("floor"), t("floor", "inner"), t("ssh-serial"), t("pdsh"),
                     times(v.ratio("attached", h, "clusterrun/floor")), times(v.ratio("attached", h, "ssh-serial/clusterrun")),
                     times(v.ratio("attached", h, "pdsh/clusterrun")), f"{t('clusterrun', 'start')} / {t('floor', 'start')}",
                     f"{t('clusterrun', 'tail')} / {t('floor', 'tail')}", phases])
        cpu_rows.append([h] + [f"{t(m, 'cpu')} + {t(m, 'hosts_cpu')} = {t(m, 'total_cpu')}" for m in METHODS_ATTACHED] +
                        [times(v.ratio("attached", h, "cpu clusterrun/floor")),
                         times(v.ratio("attached", h, "ctl-cpu clusterrun/floor")),
                         times(v.ratio("attached", h, "hosts-cpu clusterrun/floor"))])
    return ["## Attached launch: command → end, a job that exits at once", "",
            "The whole command as a user waits for it: connect, push (unchanged: nothing sent), start, the job, "
            "every rank's end seen, the process gone. Floor: a fresh Python that imports paramiko, connects to "
            "every host in threads, runs the same job and waits (its time after the imports: in-process). Start: "
            "the last rank's first statement − spawn; tail: the process end − the last rank's last statement.",
            ""] + table(["hosts", "clusterrun", "floor (whole process)", "floor in-process", "serial ssh loop", "pdsh",
                         "clusterrun ÷ floor", "serial ÷ clusterrun", "pdsh ÷ clusterrun", "start clusterrun / floor",
                         "tail clusterrun / floor", "clusterrun phases connect / push / start"], rows) + [
        "CPU seconds per launch, controller + hosts (every process in the hosts' containers: sshd, the host "
        "program, the ranks; on this machine they share the controller's cores).", ""] + table(
        ["hosts"] + list(METHODS_ATTACHED) + ["total ÷ floor", "controller ÷ floor", "hosts ÷ floor"], cpu_rows) + \
        versus_lines(v, "attached", [("time", "clusterrun/versus", "clusterrun/floor", "versus/floor"),
                                     ("CPU (controller + hosts)", "cpu clusterrun/versus", "cpu clusterrun/floor",
                                      "cpu versus/floor")])


def versus_lines(v: View, sec: str, figures: Sequence[tuple]) -> List[str]:
    """With --versus REV: clusterrun against itself at REV, paired per repetition, and each against the floor."""
    sizes = [h for h in v.hosts(sec) if v.ratio(sec, h, figures[0][1]) is not None]
    if not sizes:
        return []
    rows = [[h, label, times(v.ratio(sec, h, new_old)), times(v.ratio(sec, h, new_floor)), times(v.ratio(sec, h, old_floor))]
            for h in sizes for label, new_old, new_floor, old_floor in figures]
    return [f"clusterrun against itself at {v.versus or '--versus'} (`versus`), interleaved in the same "
            "repetitions: ratios paired per repetition, medians.", ""] + table(
        ["hosts", "figure", "clusterrun ÷ versus", "clusterrun ÷ floor", "versus ÷ floor"], rows)


METHODS_ATTACHED = ("clusterrun", "floor", "ssh-serial", "pdsh")

HOSTCPU = (("sshd", "sshd & login shells"), ("host_startup", "host program: Python start-up"),
           ("host_receive", "host program: the held push (answer, start, follow)"),
           ("host_push_start", "… of it, until the rank runs (push answer, start)"),
           ("host_follow", "… of it, after (follow, the end)"),
           ("host_other", "host program: other commands"), ("supervisor", "supervisor (fork)"),
           ("rank_startup", "rank: Python start-up"), ("rank", "rank: the job (and its stack bootstrap)"),
           ("total", "total (the containers' cgroups)"))


def hostcpu(v: View) -> List[str]:
    """Each host's CPU in an attached launch, by process (bench/sections/hostcpu.py)."""
    sizes = v.hosts("hostcpu")
    rows = [[label] + [f"{num(v('hostcpu', h, 'clusterrun', 'cpu_' + key), 0)} / "
                       f"{num(v('hostcpu', h, 'floor', 'cpu_' + key), 0)}" for h in sizes] for key, label in HOSTCPU]
    rows.append(["total: clusterrun ÷ floor"] + [times(v.ratio("hostcpu", h, "clusterrun/floor")) for h in sizes])
    versus = any(v.ratio("hostcpu", h, "clusterrun/versus") is not None for h in sizes)
    if versus:  # --versus REV: the same split of clusterrun at REV, then the paired ratios
        rows += [[f"versus: {label}"] + [num(v("hostcpu", h, "versus", "cpu_" + key), 0) for h in sizes]
                 for key, label in HOSTCPU]
        rows += [[f"total: {name.replace('/', ' ÷ ')}"] + [times(v.ratio("hostcpu", h, name)) for h in sizes]
                 for name in ("clusterrun/versus", "versus/floor")]
    return ["## Per-host CPU of an attached launch, by process", "",
            "Milliseconds of CPU per host, clusterrun / the whole-process floor (the same job, `stamp.py --sleep 0`), "
            "medians. Every Python process on the hosts runs under bench/jobs/cpuwrap.py, which writes its own "
            "CPU as it ends; sshd & shells is the rest of the containers' cgroup total."
            + (f" versus: clusterrun at {v.versus or '--versus'}, interleaved with the others."
               if versus else ""), ""] + table(["where"] + [f"{h} hosts" for h in sizes], rows)


def launch(v: View) -> List[str]:
    rows = []
    for h in v.hosts("launch"):
        t = lambda m, h=h: num(v("launch", h, m, "time"))  # noqa: E731
        phases = " / ".join(num(v("launch", h, "clusterrun", f"phase_{p}")) for p in ("connect", "push", "start"))
        cpu = lambda m, h=h: num(v("launch", h, m, "total_cpu"))  # noqa: E731
        rows.append([h, t("clusterrun"), t("floor"), num(v("launch", h, "floor", "inner")), t("floor-job"),
                     t("ssh-serial"), t("pdsh"),
                     times(v.ratio("launch", h, "clusterrun/floor")),
                     times(v.ratio("launch", h, "clusterrun/fair-floor")),
                     times(v.ratio("launch", h, "ssh-serial/clusterrun")),
                     times(v.ratio("launch", h, "clusterrun/pdsh")), f"{cpu('clusterrun')} / {cpu('floor-job')}",
                     phases])
    return ["## Launch --detach: command → every rank running", ""] + table(
        ["hosts", "clusterrun", "floor (paramiko threads: connect + `true`)", "floor in-process",
         "fair floor (paramiko starting the job's Python)", "serial ssh loop", "pdsh", "clusterrun ÷ floor",
         "clusterrun ÷ fair floor", "serial ÷ clusterrun", "clusterrun ÷ pdsh",
         "CPU-s controller + hosts: clusterrun / fair floor", "clusterrun phases connect / push / start"], rows)


def push(v: View, meta: dict) -> List[str]:
    size = meta.get("push", {"mb": 100, "files": 1000})
    rows, detail = [], []
    for h in v.hosts("push"):
        t = lambda m, h=h: num(v("push", h, m, "time"))  # noqa: E731
        rows.append([h, t("clusterrun"), num(v("push", h, "clusterrun", "phase_push")), t("scp"), t("rsync"), t("sftp"),
                     times(v.ratio("push", h, "sftp/clusterrun")), pct(v.ratio("push", h, "fastest/clusterrun")),
                     t("clusterrun-unchanged"), times(v.ratio("push", h, "unchanged/floor")), t("floor")])
        payload = v("push", h, "clusterrun", "payload_bytes")
        for m in ("clusterrun", "clusterrun-unchanged", "scp", "rsync", "sftp"):
            secs = v("push", h, m, "time")
            if secs is None:
                continue
            rate = DASH if m.endswith("unchanged") or not payload else f"{payload / secs / 1e6:.0f}"
            detail.append([h, m, rate, num(v("push", h, m, "wire_bytes"), 1, 1e-6), num(v("push", h, m, "cpu")),
                           num(v("push", h, m, "hosts_cpu")), num(v("push", h, m, "payload_bytes"), 3, 1e-6, " MB")])
    return [f"## Push: {size['mb']} MB + {size['files']:,} files to every host", "",
            "Wall time of the whole command, connections included; clusterrun's is a whole `launch --detach` of a "
            "job that does nothing (its push phase alone beside it).", ""] + table(
        ["hosts", "clusterrun first", "(push phase)", "scp", "rsync", "paramiko SFTP", "sftp ÷ clusterrun",
         "clusterrun speed vs fastest baseline", "clusterrun unchanged", "unchanged ÷ floor", "floor"], rows) + [
        "Controller CPU: the command and its children. Hosts CPU: every process in the hosts' containers "
        "(sshd, receivers, the job), which on this machine share the controller's 2 cores.", ""] + table(
        ["hosts", "method", "MB/s (payload, all hosts)", "wire MB sent", "controller CPU s", "hosts CPU s",
         "payload sent (clusterrun's record)"], detail)


def pull(v: View, meta: dict) -> List[str]:
    size = meta.get("push", {"mb": 100, "files": 1000})
    payload = size["mb"] * (1 << 20)
    rows, detail = [], []
    for h in v.hosts("pull"):
        t = lambda m, h=h: num(v("pull", h, m, "time"))  # noqa: E731
        rows.append([h, t("clusterrun"), t("scp"), t("rsync"), times(v.ratio("pull", h, "scp/clusterrun")),
                     times(v.ratio("pull", h, "rsync/clusterrun")), t("clusterrun-unchanged"), t("rsync-unchanged"),
                     t("clusterrun-all"), t("scp-all"), t("rsync-all"),
                     times(v.ratio("pull", h, "rsync-all/clusterrun-all"))])
        for m in ("clusterrun", "scp", "rsync", "clusterrun-unchanged", "rsync-unchanged", "clusterrun-all",
                  "scp-all", "rsync-all"):
            secs = v("pull", h, m, "time")
            if secs is None:
                continue
            hosts = int(h) if m.endswith("-all") else 1
            rate = DASH if m.endswith("unchanged") else f"{hosts * payload / secs / 1e6:.0f}"
            detail.append([h, m, rate, num(v("pull", h, m, "wire_bytes"), 1, 1e-6), num(v("pull", h, m, "cpu")),
                           num(v("pull", h, m, "hosts_cpu"))])
    return [f"## Pull: a run's outputs ({size['mb']} MB + {size['files']:,} files per host) back here", "",
            "Wall time of the whole command, connections included, into an empty folder; unchanged: the same "
            "command again. One host: rank 0's; all: every host at once, a folder each.", ""] + table(
        ["hosts", "clusterrun", "scp", "rsync", "scp ÷ clusterrun", "rsync ÷ clusterrun", "clusterrun unchanged",
         "rsync unchanged", "clusterrun --all-hosts", "scp, all hosts", "rsync, all hosts",
         "rsync all ÷ clusterrun all"], rows) + [""] + table(
        ["hosts", "method", "MB/s (the 100 MB file's bytes)", "wire MB received", "controller CPU s", "hosts CPU s"],
        detail)


def logs(v: View) -> List[str]:
    rows = []
    for h in v.hosts("logs"):
        rate = lambda m, h=h: f"{num(v('logs', h, m, 'lines_per_s'), 0, 1e-3, 'k')} " \
                         f"({num(v('logs', h, m, 'lines_per_s_e2e'), 0, 1e-3, 'k')})"  # noqa: E731
        delay = lambda m, d, h=h: " / ".join(num(v("logs", h, m, "delay", p), d, 1e3) for p in ("p50", "p95"))  # noqa: E731
        bad = "/".join(num(v("logs", h, "clusterrun", k, "max"), 0) for k in ("lost", "duplicated", "damaged"))
        cpu = f"{num(v('logs', h, 'clusterrun', 'cpu'), 1)} ({num(v('logs', h, 'clusterrun', 'cpu_per_mline'), 1)})"
        folded = v("logs", h, "clusterrun-no-fold", "delay", "p50") is not None  # from 16 ranks the view folds
        rows.append([h, rate("clusterrun"), rate("ssh"), times(v.ratio("logs", h, "clusterrun/ssh")), bad, cpu,
                     num(v("logs", h, "ssh", "cpu"), 1),
                     delay("clusterrun", 0) + (f" (folded; --no-fold {delay('clusterrun-no-fold', 0)})" if folded else ""),
                     delay("ssh", 1)])
    return ["## Logs: every rank printing flat out; one line a second", "",
            "lines/s: lines received ÷ (last arrival − first arrival); in brackets ÷ (command end − spawn), "
            "start-up included.", ""] + table(
        ["hosts", "clusterrun lines/s", "OpenSSH lines/s", "clusterrun ÷ ssh", "lost / dup / damaged",
         "controller CPU s (per M lines)", "ssh CPU s", "delay p50 / p95 ms (clusterrun)", "delay p50 / p95 ms (ssh)"],
        rows)


def teardown(v: View) -> List[str]:
    rows = []
    for h in v.hosts("teardown"):
        t = lambda m, metric, h=h: num(v("teardown", h, m, metric))  # noqa: E731
        left = max((v("teardown", h, m, "left_processes", "max") or 0) for m in ("crash", "stop"))
        grace = max((v("teardown", h, m, "grace_used") or 0) for m in ("crash", "stop"))
        rows.append([h, t("crash", "time"), t("crash", "term_delivered"), t("crash", "controller_exit"),
                     t("stop", "time"), t("stop", "controller_exit"), num(grace), f"{left:.0f}"])
    return ["## Teardown: to every rank gone", ""] + table(
        ["hosts", "crash → ranks gone", "crash → TERM delivered", "crash → controller exit", "stop → ranks gone",
         "stop command", "grace used", "processes left"], rows)


def training(v: View) -> List[str]:
    rows = []
    for h in v.hosts("training"):
        r = [v.ratio("training", h, "clusterrun/by-hand", k) for k in ("median", "min", "max")]
        paired = DASH if r[0] is None else f"{pct(r[0], 1)} ({pct(r[1])}–{pct(r[2])})"
        wall = f"{num(v('training', h, 'clusterrun', 'time'), 1)} / {num(v('training', h, 'by-hand', 'time'), 1)}"
        rows.append([h, num(v("training", h, "clusterrun", "samples_per_s"), 0),
                     num(v("training", h, "by-hand", "samples_per_s"), 0), paired, wall])
    return ["## Training: samples/s of the example job", ""] + table(
        ["hosts", "clusterrun", "by hand (ssh)", "clusterrun ÷ by hand (min–max over repetitions)",
         "wall s clusterrun / by hand"], rows)


SCALING = [("attached", "time", "s", METHODS_ATTACHED),
           ("attached", "total_cpu", "CPU s", METHODS_ATTACHED),
           ("launch", "time", "s", ("clusterrun", "floor", "ssh-serial", "pdsh")),
           ("push", "time", "s", ("clusterrun", "clusterrun-unchanged", "scp", "rsync", "sftp")),
           ("push", "cpu", "CPU s", ("clusterrun", "scp", "rsync", "sftp")),
           ("push", "hosts_cpu", "hosts CPU s", ("clusterrun", "scp", "rsync", "sftp")),
           ("logs", "cpu", "CPU s", ("clusterrun", "ssh")),
           ("teardown", "time", "s", ("crash", "stop"))]


def _slope(points: List[tuple]) -> Optional[float]:
    """Least-squares slope of (hosts, value)."""
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def scaling(v: View) -> List[str]:
    """How each cost grows with hosts: the medians side by side and the slope per added host."""
    sizes = sorted({int(h) for sec in v.summary.values() for h in sec})
    if len(sizes) < 2:
        return []
    rows = []
    for sec, metric, unit, methods in SCALING:
        for m in methods:
            vals = {h: v(sec, h, m, metric) for h in sizes}
            pts = [(h, x) for h, x in vals.items() if x is not None and x == x]  # x == x: not NaN
            if len(pts) >= 2:
                rows.append([f"{sec} {metric} ({unit})", m] + [num(vals[h]) for h in sizes] +
                            [num(_slope(pts), 0, 1e3, " ms")])
    return ["## Scaling: cost versus hosts", "",
            "Medians at each size; the last column is the least-squares increase per added host.", ""] + table(
        ["figure", "method"] + [f"{h} hosts" for h in sizes] + ["per added host"], rows)


def stacks(v: View) -> List[str]:
    """`clusterrun stacks` on a detached hang (bench/sections/stacks.py) beside the floor of reaching every host."""
    rows = [[h, num(v("stacks", h, "clusterrun stacks", "time")), num(v("stacks", h, "floor", "time")),
             num(v("stacks", h, "pdsh", "time")), num(v("stacks", h, "clusterrun stacks", "cpu"))]
            for h in v.hosts("stacks")]
    return ["## stacks", "", "`clusterrun stacks RUN`, the whole command (spawn to exit), against connect + `true` "
            "on every host (paramiko floor, pdsh).", ""] + \
        table(["hosts", "clusterrun stacks", "floor", "pdsh", "clusterrun CPU-s"], rows)


SCALE = ("launch", "launch floor", "ps", "logs", "exec", "exec floor", "stacks", "top --once", "stop", "clean")


def scale(v: View) -> List[str]:
    """Every command at 64 and 128 hosts (issue 37): wall time per command, failures, the floors' ratios."""
    rows = []
    for h in v.hosts("scale"):
        for m in SCALE:
            rounds, failed = v("scale", h, m, "failed", "n"), v("scale", h, m, "failed", "sum")
            if rounds is None:
                continue
            ratio = {"launch": "launch/floor", "exec": "exec/floor"}.get(m)
            rows.append([h, m, num(v("scale", h, m, "time")), num(v("scale", h, m, "time", "p90")),
                         num(v("scale", h, m, "time", "max")), f"{int(failed)} of {int(rounds)}",
                         times(v.ratio("scale", h, ratio)) if ratio else DASH,
                         num(v("scale", h, m, "cpu"))])
    return ["## Scale: every command at many hosts, round after round", "",
            "Each round runs every command once as a user would (a new process, spawn → exit); launch and exec "
            "alternate with their whole-process floor (a fresh Python, paramiko, a thread per host, the same job "
            "or `hostname`). Every round must pass: a failed command is counted here and its message is in the "
            "notes. Times over the rounds that passed; ratio: the median of the per-round ratios to the floor.",
            ""] + table(["hosts", "command", "median", "p90", "max", "failed", "÷ floor", "controller CPU"], rows)


def meta_line(meta: dict) -> str:
    """Where and how a run measured (the machine, the commit, the repetitions, the command)."""
    return (f"Container cluster on one machine ({meta.get('machine', '')}); clusterrun {meta.get('clusterrun', '')}. "
            f"Medians of {meta.get('reps_text', '')} interleaved repetitions (each repetition runs every method once, "
            "back to back, in a rotating order); ratios are the median over repetitions of the ratio within a "
            "repetition, which cancels the drift of this shared machine; times in seconds. "
            f"Command: `{meta.get('command', '')}`.")


def markdown(data: dict) -> str:
    v, meta = View(data["summary"], data["meta"].get("versus")), data["meta"]
    out = [f"# clusterrun benchmarks ({meta.get('date', '')})", "", meta_line(meta), ""]
    for name, part in (("attached", attached), ("launch", launch), ("push", lambda v: push(v, meta)), ("logs", logs),
                       ("teardown", teardown), ("training", training), ("pull", lambda v: pull(v, meta)),
                       ("stacks", stacks), ("hostcpu", hostcpu), ("scale", scale)):
        if v.hosts(name):
            out += part(v)
    out += scaling(v)
    mark = {True: "pass", False: "**miss**", None: DASH}
    out += ["## Targets", ""] + table(["target", "hosts", "measured", "result"],
                                      [[t["target"], t["hosts"], t["shown"], mark[t["pass"]]] for t in data["targets"]])
    if data.get("notes"):
        out += ["## Notes", ""] + [f"- {n['section']} @ {n['hosts']} hosts: {n['text']}" for n in data["notes"]] + [""]
    if data.get("profiles"):
        out += ["## Controller profile", ""]
        for p in data["profiles"]:
            out += [f"{p['what']} at {p['hosts']} hosts: functions by share of the samples where Python held the "
                    f"GIL (py-spy; all of it in `{p['text']}`, wall time by pyinstrument in `{p.get('wall_text')}`)",
                    ""] + table(["self %", "function"], [[f"{x:.1f}", f"`{k}`"] for k, x in p["self"][:10]])
    return "\n".join(out) + "\n"
