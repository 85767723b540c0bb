"""`clusterrun stacks` on a recorded run while it runs, also after `--detach` or with the controller dead:
every rank's stacks, gathered from its hosts in parallel and folded (stacks.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from .. import stacks as st
from ..errors import RunEnded, UsageError
from ..hosts.group import on_hosts
from ..plan import attempt_key
from ..registry.store import RunStore
from .nodes import Connect, nodes_of


@dataclass(frozen=True)
class StacksReport:
    run_id: str
    world: int
    ranks: Tuple[st.RankStack, ...]
    groups: Tuple[st.Group, ...]
    unreachable: Dict[str, str]  # host → why it could not be asked

    def to_json(self) -> dict:
        return st.to_json(self.run_id, self.ranks, self.groups, self.unreachable)

    @property
    def vias(self) -> Dict[str, int]:
        """How the stacks were read: {"py-spy": n, "faulthandler": m} (ranks that run)."""
        out: Dict[str, int] = {}
        for r in self.ranks:
            if r.via:
                out[r.via] = out.get(r.via, 0) + 1
        return out


def gather_stacks(store: RunStore, run_id: str, connect: Connect, ranks: Sequence[int] = (),
                  via: str = "auto") -> StacksReport:
    """Ask every host of the run's current attempt (or only those of `ranks`) for its ranks' stacks."""
    record = store.get(run_id)
    host_of = _readable(record, run_id, ranks)
    _, nodes = nodes_of(record)
    wanted = [n for n in nodes if not ranks or n.host.name in {host_of[r] for r in ranks}]
    key = attempt_key(run_id, record.attempt)
    asked = on_hosts(wanted, connect, lambda node, client: client.stacks(key, ranks, via), thread_name="stacks")
    found = _answers(wanted, asked, ranks)
    seen = {s.rank for s in found}
    # the ranks of a host that did not answer still get their line
    found += [st.RankStack(rank, host, None, "unreachable", "", error=asked.errors[host].message)
              for rank, host in sorted(host_of.items())
              if rank not in seen and host in asked.errors and (not ranks or rank in ranks)]
    found.sort(key=lambda s: s.rank)
    if not ranks and not asked.failed:
        _refuse_if_all_ended(run_id, found)
    return StacksReport(run_id, len(host_of), tuple(found), tuple(st.fold(found)),
                        {name: err.message for name, err in asked.failed.items()})


def _readable(record, run_id: str, ranks: Sequence[int]) -> Dict[int, str]:
    """The run's ranks and their hosts, once the run may have stacks to read (RunEnded if its record
    says it ended: no host needs asking) and every rank asked for is one of them."""
    if record.terminal:
        raise RunEnded(_ended(run_id, f"{record.state.value}, exit {record.exit_code}", record.ended_at))
    host_of = {r.rank: r.host for r in record.ranks}
    unknown = sorted(set(ranks) - set(host_of))
    if unknown:
        raise UsageError(f"run {run_id} has no rank {', '.join(map(str, unknown))} "
                         f"(it has ranks 0-{len(host_of) - 1})")
    return host_of


def _refuse_if_all_ended(run_id: str, found: Sequence[st.RankStack]) -> None:
    """Every rank has exited on its host (a detached run's end the record does not know yet): RunEnded."""
    if found and all(s.state == "ended" for s in found):
        raise RunEnded(_ended(run_id, "every rank has exited on its host", None))


def _ended(run_id: str, how: str, when) -> str:
    at = time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(when)) if when else ""
    return (f"run {run_id} ended{at} ({how}): no rank runs, so there are no stacks to read; `clusterrun logs "
            f"{run_id}` shows what the ranks printed")


def _answers(nodes: Sequence, asked, ranks: Sequence[int]) -> List[st.RankStack]:
    found: List[st.RankStack] = []
    for node in nodes:
        answer = asked.results.get(node.host.name)
        if answer is not None:
            found += [s for s in st.from_host(node.host.name, answer) if not ranks or s.rank in ranks]
    return found
