"""Tables and listings the commands print: the dry run's plan, `ps`, a sweep's results, `exec`, `clean`,
`pull` (claims on shared hosts: claims.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import HostError
from ..events import counted
from ..registry.store import RunRecord
from .fold import host_ranges

if TYPE_CHECKING:  # `ps` renders runs without loading the planner (and with it the inventory and YAML)
    from ..clean.apply import HostClean
    from ..plan import LaunchPlan
    from ..runs.pull import PullResult


def show_plan(plan: "LaunchPlan", out: Console, routes: Optional[Dict[str, str]] = None) -> None:
    """The dry run: the rank table, how each SSH host is reached (each value and where it came from), then
    the exact line every rank runs (secrets masked)."""
    from ..plan import render_node_command, render_rank_command

    table = Table(title=f"{counted(plan.world_size, 'rank')} on {counted(len(plan.nodes), 'host')} · MASTER_ADDR={plan.master_addr} "
                        f"MASTER_PORT={plan.master_port or 'auto'} · {plan.backend} {plan.init_url}",
                  title_justify="left")
    gpus = any(node.gpus is not None for node in plan.nodes)
    for col in ("rank", "local", "node", "host", "connection", "run folder") + (("GPU",) if gpus else ()):
        table.add_column(col)
    for node in plan.nodes:
        target = _target(node.host)
        for r in node.ranks:
            table.add_row(str(r.rank), str(r.local_rank), str(node.node_rank), node.host.name,
                          f"{node.host.connection} {target}", node.run_dir, *((_gpu_cell(node, r),) if gpus else ()))
    out.print(table)
    for name, route in (routes or {}).items():
        out.print(Text(f"# {name}: ", style="bold") + Text(route))
    _interfaces(plan, out)
    _show_gpus(plan, out)
    _start_order(plan, out)
    for node in plan.nodes:
        if node.torchrun:
            ranks = ", ".join(str(r.rank) for r in node.ranks)
            out.print(Text(f"# {node.host.name}: torchrun, {len(node.ranks)} workers (ranks {ranks} expected; "
                           "its rendezvous decides)", style="bold"))
            out.print(Text(render_node_command(plan, node)))
            continue
        for r in node.ranks:
            out.print(Text(f"# {node.host.name} rank {r.rank}", style="bold"))
            out.print(Text(render_rank_command(plan, node, r)))
    out.print(Text("dry run: nothing was connected to, pushed or started", style="dim"))


def _start_order(plan: "LaunchPlan", out: Console) -> None:
    """job.start: every host at once, or each rank's earliest start in rank order (launch/start.py)."""
    from ..launch.start import order_lines

    for line in order_lines(plan):
        out.print(Text(line, style="bold" if line.startswith("# start") else ""))


def _target(host) -> str:
    """How the dry run names where a host is reached: `ssh user@host:port`, or `local localhost`."""
    user = f"{host.user}@" if host.user else ""
    port = f":{host.port}" if host.port else ""
    return host.host if host.connection == "local" else f"{user}{host.host}{port}"


def _gpu_cell(node, rank) -> str:
    exact = node.exact_gpus
    if exact:
        return f"cuda:{rank.local_rank} = GPU {exact[rank.local_rank]}"
    return f"cuda:{rank.local_rank}" if node.gpus is not None else "-"


def _show_gpus(plan: "LaunchPlan", out: Console) -> None:
    """Each host's CUDA_VISIBLE_DEVICES: the GPUs named, or how many are chosen at launch from which."""
    for node in plan.nodes:
        if node.gpus is not None:
            claims = f"claimed in {node.host.claims_dir}" if node.host.claims_dir else "claims: off"
            out.print(Text(f"# {node.host.name}: CUDA_VISIBLE_DEVICES={node.gpu_text()} ({claims})", style="bold"))


def _interfaces(plan: "LaunchPlan", out: Console) -> None:
    """network.ifname: what torch will use on each host, and why."""
    for node in plan.nodes:
        net = node.network
        if net is not None:
            sets = " → " + " ".join(f"{v}={net.ifname}" for v in net.env) if net.ifname and net.env else ""
            out.print(Text(f"# {node.host.name} interface: ", style="bold") + Text(net.why + sets))


PS_NOTE_MIN = 24  # narrower than this, the note column would say nothing: less important columns go first
PS_NOTE_MAX = 200  # characters of a note (cut at a word)


def show_runs(records: Sequence[Tuple[RunRecord, Dict[str, HostError]]], out: Console,
              disk: Optional[Dict[str, dict]] = None) -> None:
    """`ps`: one row per run, newest first; the note says what is pending or could not be asked; with
    disk (`ps --disk`), the bytes each run keeps on its hosts. The run id and state are never cut: on a
    narrow terminal the hosts, start and duration columns go, and the note wraps at words."""
    now = time.time()
    rows = []
    for record, problems in records:  # hosts and ranks: the current attempt's (a restart may drop hosts)
        ended = record.ended_at or now
        rows.append({"run": record.id, "state": _run_state(record),
                     "hosts": str(len(record.plan.get("nodes", record.hosts))), "ranks": str(len(record.ranks)),
                     "started": _when(record.created_at, now),
                     "duration": f"{ended - record.created_at:.0f} s",
                     "exit": "" if record.exit_code is None else str(record.exit_code),
                     **({"disk": _disk_cell(disk.get(record.id) or {})} if disk else {}),
                     "note": one_line(_run_note(record, problems), PS_NOTE_MAX)})
    columns = _ps_columns(rows, out.width, bool(disk))
    table = Table(title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in columns:
        table.add_column(col, no_wrap=col != "note", justify="right" if col in ("hosts", "ranks", "duration", "exit")
                         else "left", overflow="fold" if col == "note" else "ellipsis")
    for row in rows:
        table.add_row(*[Text(row[c]) if c == "note" else row[c] for c in columns])
    out.print(table)


def _ps_columns(rows: Sequence[dict], width: int, disk: bool) -> List[str]:
    """The columns that fit beside a note of at least PS_NOTE_MIN characters, dropping the least needed."""
    columns = ["run", "state", "hosts", "ranks", "started", "duration", "exit"] + (["disk"] if disk else []) + ["note"]

    def need(col: str) -> int:
        return max([len(col)] + [len(r[col]) for r in rows]) + 3  # padding and the gap between columns

    note = min(PS_NOTE_MIN, need("note"))  # short notes (or none) leave room for more columns
    for optional in ("hosts", "started", "duration", "ranks"):
        if sum(need(c) for c in columns if c != "note") + note <= width:
            break
        columns.remove(optional)
    return columns


def _when(at: float, now: float) -> str:
    """The time of day for today, else the date too."""
    same_day = time.localtime(at)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M", time.localtime(at))


def one_line(text: str, limit: int) -> str:
    """Whitespace (newlines too) folded to single spaces; cut at a word boundary with … past limit."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2:] else cut) + "…"


def _run_state(record: RunRecord) -> str:
    state = record.state.value
    if record.restarts:  # job.restarts: which attempt, of how many the run may make
        state += f" ({record.attempt + 1}/{record.restarts + 1})"
    return state


def _run_note(record: RunRecord, problems: Dict[str, HostError]) -> str:
    """Why the run ended, then what is pending, which hosts torchrun restarted, which could not be asked."""
    parts = [record.reason] if record.reason else []
    if record.cleanup_pending:
        parts.append(f"stop pending on {', '.join(record.cleanup_pending)}")
    restarted = [f"{h.name} {h.restarts}" for h in record.hosts if h.restarts]
    if restarted:
        parts.append("torchrun restarts: " + ", ".join(restarted))
    if problems:
        parts.append("unreachable: " + ", ".join(problems))
    return "; ".join(parts)


def _disk_cell(d: dict) -> str:
    """What a run keeps on its hosts (`ps --disk`); "removed" once clean took it off all of them."""
    from ..config.sizes import size_text

    return "removed" if not d.get("hosts") and d.get("removed_from") else size_text(d.get("bytes", 0))


def show_sweep(table: Sequence[dict], out: Console) -> None:
    result = Table(title="sweep results (speed-up and efficiency against the fewest nodes)", title_justify="left")
    for col in ("point", "status", "ranks", "train s", "samples/s", "speed-up", "efficiency", "loss", "accuracy"):
        result.add_column(col)

    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for r in table:
        result.add_row(r["point"], r["status"], num(r["ranks"], "d"), num(r["train_s"], ".2f"),
                       num(r["samples_per_s"], ".0f"), num(r["speedup"], ".2f"), num(r["efficiency"], ".0%"),
                       num(r["final_loss"], ".3f"), num(r["test_accuracy"], ".3f"))
    out.print(result)


def fold_outputs(outputs: Sequence[Tuple[str, bytes]]) -> list:
    """Hosts with identical output together (dshbak -c): [(hosts, output)], in the order first seen."""
    groups: Dict[bytes, list] = {}
    for host, text in outputs:
        groups.setdefault(text, []).append(host)
    return [(hosts, text) for text, hosts in groups.items()]


def show_exec(outputs, failed: Dict[str, str], logs, err: Console) -> None:
    """exec's output on stdout, folded and prefixed by the hosts that printed it; then, when anything
    failed, a table of the hosts that did not exit 0 or could not be reached (on stderr)."""
    for hosts, text in fold_outputs([(o.host, o.text) for o in outputs]):
        if text:
            logs.write(host_ranges(hosts), None, text if text.endswith(b"\n") else text + b"\n")
    bad = [o for o in outputs if o.exit_code != 0]
    if not bad and not failed:
        return
    table = Table(title="hosts that did not succeed", title_justify="left")
    for col in ("host", "exit", "why"):
        table.add_column(col)
    for o in bad:
        last = (o.stderr or o.stdout).decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        table.add_row(o.host, str(o.exit_code), Text(last[0][:150]))
    for host, why in failed.items():
        table.add_row(host, "-", Text(why[:150]))
    err.print(table)


def show_clean(results, rules: str, dry_run: bool, out: Console) -> None:
    """`clean`: per host what went (or would), what the cache gave back, what stayed and why, free space."""
    from ..config.sizes import size_text

    table = Table(title=("would remove" if dry_run else "removed") + f" ({rules})", title_justify="left")
    for col in ("host", "runs", "freed", "cache", "kept", "free now"):
        table.add_column(col)
    for h in results:
        if h.error is not None:
            table.add_row(h.host, Text(str(h.error), style="red"), "", "", "", "")
            continue
        free = h.usage.get("free")
        table.add_row(h.host, str(len(h.removed)), size_text(h.freed), _cache_text(h), _kept_text(h),
                      "-" if free is None else f"{size_text(free)} of {size_text(h.usage.get('total', 0))}")
    out.print(table)
    for h in results:
        for r in h.refused:
            out.print(Text(f"{h.host}: {r['id']}: refused: {r['why']}", style="bold red"))
        _unpulled_lines(h, out)
    if dry_run:
        out.print(Text("dry run: nothing was removed", style="dim"))


def _unpulled_lines(h: HostClean, out: Console) -> None:
    """A line for each run kept because its outputs were never pulled (the one kind of keep to act on)."""
    from ..clean.policy import UNPULLED

    refused = {r["id"] for r in h.refused}
    for d in h.decisions:
        if not d.remove and d.why.startswith(UNPULLED) and d.run_id not in refused:
            out.print(Text(f"{h.host}: {d.run_id}: kept: {d.why}", style="yellow"))


def _cache_text(h: HostClean) -> str:
    """What collecting the content cache gave back ("-": it was not collected)."""
    from ..config.sizes import size_text

    cache = h.cache or {}
    text = "busy (a push held it)" if cache.get("busy") else \
        (f"{cache.get('removed', 0)} objects, {size_text(cache.get('bytes', 0))}" if h.cache else "-")
    envs = (h.envs or {}).get("removed") or []
    return text + (f"; {len(envs)} env(s), {size_text(h.envs.get('bytes', 0))}" if envs else "")


def _kept_text(h: HostClean) -> str:
    """How many runs stayed, by the first word of why ("3 running; 2 not named")."""
    reasons: Dict[str, int] = {}
    for d in h.decisions:
        if not d.remove:
            reasons[d.why.split(":")[0]] = reasons.get(d.why.split(":")[0], 0) + 1
    return "; ".join(f"{n} {why}" for why, n in sorted(reasons.items())) or "0"


def show_local_clean(done: Sequence[Tuple[str, bool, str]], dry_run: bool, out: Console) -> None:
    gone = [(i, w) for i, r, w in done if r]
    verb = "would remove" if dry_run else "removed"
    out.print(Text(f"{verb} {len(gone)} of {len(done)} runs from this machine's registry and log copies"
                   + ("" if dry_run else " (each leaves a tombstone)")))
    for run_id, why in gone:
        out.print(Text(f"  {run_id}: {why}", style="dim"))


def show_pull(result: "PullResult", out: Console) -> None:
    """`pull`: per host what the PATHs selected, what came (new or changed, resumed), what did not match
    or was passed over; then where the files are."""
    from ..config.sizes import size_text

    for h in result.hosts:
        resumed = f", {h.resumed} resumed" if h.resumed else ""
        out.print(Text(f"{h.host}: {counted(h.files, 'file')}, {h.fetched} fetched ({size_text(h.received)}{resumed}), "
                       f"{h.files - h.fetched} unchanged -> {h.folder}"))
        for path in h.unmatched:
            out.print(Text(f"{h.host}: {path}: matched nothing", style="yellow"))
        for path, why in h.skipped:
            out.print(Text(f"{h.host}: {path}: {why}", style="yellow"))
    for err in result.failed.values():
        out.print(Text(str(err), style="bold red"))
    if result.snapshot:
        out.print(Text(f"run {result.run_id} had not ended: its files as they were just now", style="dim"))
    out.print(Text(f"pulled into {result.folder}", style="bold"))


def show_leftovers(found, errors, dry_run: bool, out: Console, target: str = "*") -> None:
    """`clean --leftovers`: every process that holds a GPU device, labelled, and which were killed (target:
    the run whose leftovers go, "*" every ended run's)."""
    if not found:
        out.print(Text("no process holds a GPU device on these hosts", style="dim"))
    else:
        table = Table(title="processes holding GPU devices", title_justify="left")
        for col in ("host", "pid", "user", "GPUs", "holder", "command", ""):
            table.add_column(col)
        for x in found:
            gpus = ",".join(map(str, x.gpus)) or ",".join(d.rsplit("/", 1)[-1] for d in x.devices) or "-"
            holder = f"{x.label} {x.run}".strip()
            doomed = dry_run and x.label == "ended-run" and target in ("*", x.run)
            done = Text("killed", style="bold") if x.killed else Text("would kill" if doomed else "left alone")
            table.add_row(x.host, str(x.pid), x.user, gpus, holder, Text(x.command[:50]), done)
        out.print(table)
    for host, exc in errors.items():
        out.print(Text(f"{host}: {exc}", style="bold red"))
    if dry_run:
        out.print(Text("dry run: nothing was killed", style="dim"))


def show_gpu_holders(found, out: Console) -> None:
    """`ps --hosts`: a line for each process that holds a GPU device (`node1 GPU 0: held by pid ...`)."""
    for x in found:
        where = f"GPU {','.join(map(str, x.gpus))}" if x.gpus else ",".join(x.devices)
        style = "yellow" if x.label in ("ended-run", "unknown") else ""
        out.print(Text(f"{x.host} {where}: held by {x.text()}", style=style))
