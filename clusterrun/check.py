"""`clusterrun check`: a preflight report of every host, checked in parallel."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .errors import HostError
from .host_agent import make_connect
from .inventory import Host, Inventory


@dataclass(frozen=True)
class CheckResult:
    name: str  # ssh | python | workdir | port
    status: str  # ok | warn | fail | skip
    detail: str
    hint: str = ""


@dataclass
class HostReport:
    host: str
    results: List[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status != "fail" for r in self.results)


@dataclass
class Report:
    hosts: List[HostReport]

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def to_json(self) -> dict:
        return {"ok": self.ok, "hosts": [{"host": h.host, "ok": h.ok, "checks": [r.__dict__ for r in h.results]}
                                         for h in self.hosts]}


def _check_host(inv: Inventory, host: Host, node_rank: int, connect) -> HostReport:
    report = HostReport(host.name)
    try:
        agent = connect(host)
    except HostError as exc:
        report.results.append(CheckResult("ssh", "fail", f"{exc.reason}: {exc.message}", exc.hint))
        return report
    try:
        report.results.append(CheckResult("ssh", "ok", "connected" if host.connection == "ssh" else "local"))
        try:
            facts = agent.probe()
        except HostError as exc:
            report.results.append(CheckResult("python", "fail", exc.message, exc.hint))
            return report
        report.results.append(CheckResult("python", "ok", f"{facts['python']} ({facts['executable']})"))
        report.results.append(CheckResult("workdir", "ok", f"{facts['disk_free'] / 1e9:.1f} GB free"))
        if node_rank == 0:
            report.results.append(CheckResult("port", "ok", f"a free port: {agent.free_port()}"))
    finally:
        agent.close()
    return report


def run_checks(inv: Inventory) -> Report:
    connect = make_connect(inv.timeouts)
    with ThreadPoolExecutor(max_workers=min(64, len(inv.hosts))) as pool:
        reports = list(pool.map(lambda ih: _check_host(inv, ih[1], ih[0], connect), enumerate(inv.hosts)))
    return Report(reports)


STYLE: Dict[str, str] = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def render_checks(report: Report, console: Console) -> None:
    table = Table(title="clusterrun check", title_justify="left")
    for col in ("host", "check", "status", "detail"):
        table.add_column(col)
    for h in report.hosts:
        for r in h.results:
            table.add_row(h.host, r.name, Text(r.status, style=STYLE[r.status]),
                          Text(r.detail + (f"\nhint: {r.hint}" if r.hint else "")))
    console.print(table)
