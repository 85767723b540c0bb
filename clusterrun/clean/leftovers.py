"""`clusterrun clean --leftovers [RUN | INVENTORY]`: the processes that hold the hosts' GPU devices, and
exactly an ended run's own among them killed (remote/host/share/leftovers.py decides, by the process
marker every rank carries; never by name, never another user's or an unmarked process)."""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

from ..config.inventory import Host
from ..errors import HostError
from ..hosts.group import on_hosts
from ..hosts.leftovers import Leftover, leftovers_request


def leftovers(hosts: Sequence[Host], connect: Callable[[Host], object], kill: str = ""
              ) -> Tuple[List[Leftover], Dict[str, HostError]]:
    """Every host's GPU holders (kill: a run id, "*" for every ended run, "" to only list), in the hosts'
    order; and the hosts that failed."""
    def one(host: Host, client) -> List[Leftover]:
        answer = client.leftovers(leftovers_request(host, kill=kill))
        return [Leftover.from_wire(host.name, d, answer.get("killed") or ()) for d in answer.get("holders") or ()]

    found = on_hosts(list(hosts), connect, one, host=lambda h: h, thread_name="leftovers")
    return [x for h in hosts for x in found.results.get(h.name, [])], dict(found.errors)
