"""Faults the tests inflict on hosts, and `restore` that undoes them all (a mixin of Cluster)."""

from __future__ import annotations

import concurrent.futures
import time

from .common import ClusterError, HostInfo
from .dockercli import docker


HOSTS_SAVED = "/etc/hosts.testcluster"  # the host's own /etc/hosts while loopback_name() holds it


class Faults:
    """crash/start, pause/unpause, partition/heal, block/unblock, loopback_name, shape, restore; needs
    Cluster's host(), exec(), wait_ready(), _states(), network and hosts."""

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

    def loopback_name(self, host: str | HostInfo, addr: str = "127.0.1.1") -> None:
        """Make the host's own name resolve to addr (Debian's and Ubuntu's default /etc/hosts: 127.0.1.1),
        as root; restore() puts the file back. docker bind-mounts /etc/hosts: it is rewritten in place."""
        h = self.host(host)
        script = (f"[ -e {HOSTS_SAVED} ] || cp /etc/hosts {HOSTS_SAVED}; "
                  f"{{ grep -v -w -- {h.name} {HOSTS_SAVED}; echo '{addr} {h.name}'; }} > /etc/hosts.new && "
                  "cat /etc/hosts.new > /etc/hosts && rm /etc/hosts.new")
        rc, _, err = self.exec(h, ["sh", "-c", script], user="root")
        if rc != 0:
            raise ClusterError(f"{h.name}: cannot edit /etc/hosts: {err.strip()}")
        self._renamed.add(h.name)

    def own_name(self, host: str | HostInfo) -> None:
        """Undo loopback_name(): the host's /etc/hosts as it was."""
        h = self.host(host)
        self.exec(h, ["sh", "-c", f"[ ! -e {HOSTS_SAVED} ] || {{ cat {HOSTS_SAVED} > /etc/hosts && "
                                  f"rm {HOSTS_SAVED}; }}"], user="root")
        self._renamed.discard(h.name)

    def shape(self, host: str | HostInfo, rate: str = "100mbit", address: str | None = None) -> str:
        """Cap what the host sends on the interface holding address (default: its cluster address) with a
        token bucket (tc tbf: netem is not in this kernel); restore() lifts it. Returns the interface."""
        h = self.host(host)
        dev = self._dev_of(h, address)
        rc, _, err = self.exec(h, ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                                   "burst", "64kb", "latency", "50ms"], user="root")
        if rc != 0:
            raise ClusterError(f"{h.name}: cannot shape {dev}: {err.strip()}")
        self._shaped.add(h.name)
        return dev

    def unshape(self, host: str | HostInfo) -> None:
        h = self.host(host)
        rc, out, _ = self.exec(h, ["ip", "-o", "link", "show"], user="root")
        for dev in (line.split()[1].rstrip(":").split("@")[0] for line in out.splitlines() if rc == 0 and line.split()):
            self.exec(h, ["tc", "qdisc", "del", "dev", dev, "root"], user="root")  # "no qdisc" where none: fine
        self._shaped.discard(h.name)

    def _dev_of(self, h: HostInfo, address: str | None = None) -> str:
        address = address or h.address
        rc, out, err = self.exec(h, ["ip", "-o", "-4", "addr", "show", "to", address], user="root")
        if rc != 0 or not out.split():
            raise ClusterError(f"{h.name}: no interface holds {address}: {err.strip()}")
        return out.split()[1].split("@")[0]

    def restore(self, timeout: float = 60.0, *, wait: bool = True, deep: bool = False) -> list[str]:
        """Undo every fault: unpause, start, reconnect, unblock, the own name, the shaping; wait for SSH
        on what was touched.

        Looks at docker's view of each container rather than trusting what this object did, so it
        also repairs faults made by another process; `deep` also looks for blackhole routes, a changed
        /etc/hosts and a shaped interface on every host (made by another process; a docker exec per
        host). Returns the hosts repaired.
        """
        states = self._states()
        if deep:
            self._find_faults(states)
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

    def _find_faults(self, states: dict[str, dict]) -> None:
        """Note the blackhole routes, a changed /etc/hosts and a token bucket of every running host
        (block(), loopback_name(), shape() by another process too)."""
        running = [h for h in self.hosts if states.get(h.container, {}).get("Status") == "running"]
        show = ["sh", "-c", f"ip -o route show type blackhole; [ ! -e {HOSTS_SAVED} ] || echo HOSTS-SAVED; "
                            "tc qdisc show | grep -q ' tbf ' && echo SHAPED; true"]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(running)))) as pool:
            found = list(pool.map(lambda h: self.exec(h, show, user="root"), running))
        for h, (rc, out, _) in zip(running, found):
            for line in out.splitlines() if rc == 0 else []:
                if line == "HOSTS-SAVED":
                    self._renamed.add(h.name)
                elif line == "SHAPED":
                    self._shaped.add(h.name)
                elif line.split():
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
        if h.name in self._renamed:
            self.own_name(h)
        if h.name in self._shaped:
            self.unshape(h)
        return fixed
