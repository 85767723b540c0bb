"""Tables and listings the commands print: the dry run's plan, `ps`, a sweep's results."""

from __future__ import annotations

import time
from typing import Dict, Sequence, Tuple

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import HostError
from ..plan import LaunchPlan, render_rank_command
from ..registry.store import RunRecord


def show_plan(plan: LaunchPlan, out: Console) -> None:
    """The dry run: the rank table, then the exact line every rank runs (secrets masked)."""
    table = Table(title=f"{plan.world_size} ranks on {len(plan.nodes)} hosts · MASTER_ADDR={plan.master_addr} "
                        f"MASTER_PORT={plan.master_port or 'auto'} · {plan.backend} {plan.init_url}",
                  title_justify="left")
    for col in ("rank", "local", "node", "host", "connection", "run folder"):
        table.add_column(col)
    for node in plan.nodes:
        user = f"{node.host.user}@" if node.host.user else ""
        port = f":{node.host.port}" if node.host.port else ""
        target = node.host.host if node.host.connection == "local" else f"{user}{node.host.host}{port}"
        for r in node.ranks:
            table.add_row(str(r.rank), str(r.local_rank), str(node.node_rank), node.host.name,
                          f"{node.host.connection} {target}", node.run_dir)
    out.print(table)
    for node in plan.nodes:
        for r in node.ranks:
            out.print(Text(f"# {node.host.name} rank {r.rank}", style="bold"))
            out.print(Text(render_rank_command(plan, node, r)))
    out.print(Text("dry run: nothing was connected to, pushed or started", style="dim"))


def show_runs(records: Sequence[Tuple[RunRecord, Dict[str, HostError]]], out: Console) -> None:
    """`ps`: one row per run, newest first; the note says what is pending or could not be asked."""
    table = Table(title_justify="left")
    for col in ("run", "state", "hosts", "ranks", "started", "duration", "exit", "note"):
        table.add_column(col)
    for record, problems in records:
        ended = record.ended_at or time.time()
        note = record.reason or ""
        if record.cleanup_pending:
            note = (note + "; " if note else "") + f"stop pending on {', '.join(record.cleanup_pending)}"
        if problems:
            note = (note + "; " if note else "") + "unreachable: " + ", ".join(problems)
        table.add_row(record.id, record.state.value, str(len(record.hosts)), str(len(record.ranks)),
                      time.strftime("%m-%d %H:%M:%S", time.localtime(record.created_at)),
                      f"{ended - record.created_at:.0f} s", "" if record.exit_code is None else str(record.exit_code),
                      Text(note[:120]))
    out.print(table)


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
