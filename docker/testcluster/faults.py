"""Faults the tests inflict on hosts, and `restore` that undoes them all (a mixin of Cluster)."""

from __future__ import annotations

import concurrent.futures
import time

from .common import ClusterError, HostInfo
from .dockercli import docker


class Faults:
    """crash/start, pause/unpause, partition/heal, block/unblock, restore; needs Cluster's host(),
    exec(), wait_ready(), _states(), network and hosts."""

    def crash(self, host: str | HostInfo) -> None:
        """Kill the whole host at once (SIGKILL to every process: a power cut)."""
        docker("kill", self.host(host).container)

    def start(self, host: str | HostInfo, wait: bool = True) -> None:
        """Start a crashed host again (same address, same host key) and wait for its sshd."""
        h = self.host(host)
        docker("start", h.container)
        if wait:
            self.wait_ready([h])

    def pause(self, host: str | HostInfo) -> None:
        """Freeze every process of the host: TCP stays open, nothing answers (a hung machine)."""
        for attempt in range(5):
            try:
                docker("pause", self.host(host).container)
                return
            except ClusterError as exc:
                # the cgroup freezer gives up ("unable to freeze") while processes are being created
                if "unable to freeze" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.05)

    def unpause(self, host: str | HostInfo) -> None:
        docker("unpause", self.host(host).container)

    def partition(self, host: str | HostInfo) -> None:
        """Cut the host off the network (from the controller and from every other host)."""
        docker("network", "disconnect", "--force", self.network, self.host(host).container)

    def heal(self, host: str | HostInfo, wait: bool = True) -> None:
        """Reconnect a partitioned host at its own address (the interface comes back as eth1)."""
        h = self.host(host)
        docker("network", "connect", "--ip", h.address, "--alias", h.name, self.network, h.container)
        if wait:
            self.wait_ready([h])

    def block(self, host: str | HostInfo, peer: str | HostInfo) -> None:
        """Drop traffic from host to peer only (a blackhole route on host); the controller still reaches both."""
        h, p = self.host(host), self.host(peer)
        rc, _, err = self.exec(h, ["ip", "route", "replace", "blackhole", f"{p.address}/32"], user="root")
        if rc != 0:
            raise ClusterError(f"{h.name}: cannot block {p.name}: {err.strip()}")
        self._blocked.setdefault(h.name, set()).add(p.address)

    def unblock(self, host: str | HostInfo, peer: str | HostInfo | None = None) -> None:
        h = self.host(host)
        blocked = self._blocked.get(h.name, set())
        for addr in ([self.host(peer).address] if peer is not None else sorted(blocked)):
            self.exec(h, ["ip", "route", "del", "blackhole", addr], user="root")
            blocked.discard(addr)

    def restore(self, timeout: float = 60.0, *, wait: bool = True, deep: bool = False) -> list[str]:
        """Undo every fault: unpause, start, reconnect, unblock; wait for SSH on what was touched.

        Looks at docker's view of each container rather than trusting what this object did, so it
        also repairs faults made by another process; `deep` also looks for blackhole routes on
        every host (block() by another process; a docker exec per host). Returns the hosts repaired.
        """
        states = self._states()
        if deep:
            self._find_blackholes(states)
        touched: list[HostInfo] = []
        for h in self.hosts:
            st = states.get(h.container)
            if st is None:
                if not wait:
                    continue
                raise ClusterError(f"{h.name}: container {h.container} is gone; run `up` again")
            if self._repair(h, st):
                touched.append(h)
        if touched and wait:
            self.wait_ready(touched, timeout=timeout)
        return [h.name for h in touched]

    def _find_blackholes(self, states: dict[str, dict]) -> None:
        """Note the blackhole routes of every running host (block() by another process too)."""
        running = [h for h in self.hosts if states.get(h.container, {}).get("Status") == "running"]
        show = ["ip", "-o", "route", "show", "type", "blackhole"]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(running)))) as pool:
            found = list(pool.map(lambda h: self.exec(h, show, user="root"), running))
        for h, (rc, out, _) in zip(running, found):
            for line in out.splitlines() if rc == 0 else []:
                self._blocked.setdefault(h.name, set()).add(line.split()[1])

    def _repair(self, h: HostInfo, st: dict) -> bool:
        """Undo the faults docker's view (st) and the blocked routes show on one host; True if there were any."""
        fixed = False
        if st["Status"] == "paused":
            docker("unpause", h.container)
            fixed = True
        elif st["Status"] != "running":
            docker("start", h.container)
            fixed = True
        if self.network not in st["Networks"]:
            self.heal(h, wait=False)
            fixed = True
        elif st["Status"] == "running" and st["Networks"][self.network] != h.address:
            raise ClusterError(f"{h.name}: at {st['Networks'][self.network]}, expected {h.address}")
        if self._blocked.get(h.name):
            self.unblock(h)
            fixed = True
        return fixed
