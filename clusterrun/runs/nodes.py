"""A recorded run's hosts as the commands on it reach them again: the inventory recorded with the run, the
hosts of an attempt, and the connection settings it was launched with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from ..config.inventory import Host, Inventory, Timeouts, inventory_from_snapshot
from ..hosts.client import HostClient, make_connect
from ..registry.records import RunRecord

Connect = Callable[[Host], HostClient]


@dataclass(frozen=True)
class Node:
    node_rank: int  # the host's place in the (current) attempt
    host: Host
    ranks: Tuple[int, ...]
    index: int  # its place in the inventory: the registry's key for hosts


def nodes_of(record: RunRecord, plan: Optional[dict] = None) -> Tuple[Inventory, List[Node]]:
    """The inventory recorded with the run, and the hosts of its current attempt (or of `plan`'s)."""
    inv = inventory_from_snapshot(record.snapshot)
    nodes = []
    for n in (plan or record.plan)["nodes"]:
        index = n.get("index", n["node_rank"])
        if index < 0:
            index = n["node_rank"]
        nodes.append(Node(n["node_rank"], inv.hosts[index], tuple(r["rank"] for r in n["ranks"]), index))
    return inv, nodes


def timeouts_of(record: RunRecord) -> Timeouts:
    """The timeouts the run was launched with."""
    return Timeouts(**(record.snapshot.get("timeouts") or {}))


def connect_for(record: RunRecord) -> Connect:
    """A connect function for the hosts of a recorded run, with the timeouts it was launched with."""
    return make_connect(timeouts_of(record))
