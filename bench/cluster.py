"""The container cluster the benchmark runs on: docker/testcluster's Cluster plus what the bench needs.

The bench owns one cluster name and subnet (crbench, 198.18.205.0/24), so a re-run never meets the
test suite's clusters; one size is up at a time.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
NAME = "crbench"
SUBNET = "198.18.205.0/24"
HOST_PYTHON = "/opt/venv/bin/python"
HOST_SHARED = "/shared"


def load_testcluster():
    """The package docker/testcluster, imported with docker/ on the path (as pytest's pythonpath does)."""
    docker_dir = str(REPO / "docker")
    if docker_dir not in sys.path:
        sys.path.insert(0, docker_dir)
    import testcluster

    return testcluster


class BenchCluster:
    """N container hosts node0..node{N-1}; host i is rank i in every benchmark."""

    def __init__(self, hosts: int, name: str = NAME, subnet: str = SUBNET):
        self.tc = load_testcluster()
        self.c = self.tc.Cluster(name, hosts=hosts, subnet=subnet)
        self.n = hosts
        self.up_seconds: Optional[float] = None
        self._bridge: Optional[str] = None
        self._cgroups: Optional[list] = None

    # lifecycle ----------------------------------------------------------------------------------
    def up(self) -> "BenchCluster":
        _blackhole()
        if self.c.state_dir.exists():  # our own name: a previous bench (maybe of another size) left it
            self.tc.Cluster(self.c.name).down()
        self.c.up(timeout=180)
        self.up_seconds = self.c.timings.get("total")
        self._bridge = _route_dev(self.addresses[0])
        return self

    def down(self) -> None:
        self.c.down()

    # facts --------------------------------------------------------------------------------------
    @property
    def addresses(self) -> List[str]:
        return [h.address for h in self.c.hosts]

    @property
    def names(self) -> List[str]:
        return [h.name for h in self.c.hosts]

    @property
    def shared(self) -> Path:
        """/shared of every host, as seen here."""
        return self.c.shared_dir

    @property
    def key(self) -> str:
        return str(self.c.key_path)

    @property
    def known_hosts(self) -> str:
        return str(self.c.known_hosts_path)

    @property
    def user(self) -> str:
        return self.tc.USER

    def ssh_options(self) -> List[str]:
        """OpenSSH options for ssh, scp, rsync and pdsh alike: the test key, host keys checked strictly."""
        return ["-F", "/dev/null", "-i", self.key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]

    def ssh_argv(self, i: int, command: str) -> List[str]:
        return ["ssh", *self.ssh_options(), "-l", self.user, self.addresses[i], command]

    def net_bytes(self) -> Dict[str, int]:
        """Bytes through the cluster's bridge since boot: tx = this machine to the hosts (wire bytes,
        SSH and TCP overhead included, the same yardstick for every method)."""
        base = Path("/sys/class/net") / self._bridge / "statistics"
        return {"tx": int((base / "tx_bytes").read_text()), "rx": int((base / "rx_bytes").read_text())}

    def hosts_cpu(self) -> float:
        """CPU seconds used so far by every process in the cluster's containers (sshd, the host programs,
        the ranks), from each container's cgroup: the hosts' side of a measurement, which on this machine
        shares the controller's cores. NaN where the cgroup files are not found."""
        if self._cgroups is None:
            argv = [self.tc.docker_bin(), "inspect", "-f", "{{.Id}}", *(h.container for h in self.c.hosts)]
            out = subprocess.run(argv, capture_output=True, text=True).stdout.split()
            found = []
            for cid in out:
                for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9),
                                    (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6)):
                    if os.path.exists(path):
                        found.append((path, scale))
                        break
            self._cgroups = found if len(found) == self.n else []
        if not self._cgroups:
            return float("nan")
        total = 0.0
        for path, scale in self._cgroups:
            text = Path(path).read_text()
            value = int(text.split()[text.split().index("usage_usec") + 1]) if "usage_usec" in text else int(text)
            total += value * scale
        return total

    # setup and cleanup (docker exec, not SSH: never part of a measurement) ------------------------
    def on_all(self, command: str, user: Optional[str] = None, timeout: float = 120) -> None:
        """Run a shell command on every host; raise naming the hosts where it failed."""
        user = user or self.user

        def one(h):
            return self.c.exec(h, ["sh", "-c", command], user=user, timeout=timeout)

        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, self.n)) as pool:
            res = list(pool.map(one, self.c.hosts))
        bad = [f"{h.name}: exit {rc}: {err.strip()[-300:]}" for h, (rc, _, err) in zip(self.c.hosts, res) if rc]
        if bad:
            raise RuntimeError(f"{command!r} failed on\n  " + "\n  ".join(bad))

    def read_file(self, i: int, path: str) -> str:
        rc, out, err = self.c.exec(self.c.hosts[i], ["cat", path], timeout=60)
        if rc:
            raise RuntimeError(f"{self.names[i]}: cat {path}: {err.strip()}")
        return out

    def leftovers(self) -> list:
        """Processes of the test user left on any host (sshd's session processes aside)."""
        return self.c.orphans()

    def kill_leftovers(self) -> int:
        left = self.c.orphans()
        for host in {p.host for p in left}:
            self.c.kill(host, [p.pid for p in left if p.host == host])
        return len(left)

    # inventories --------------------------------------------------------------------------------
    def write_inventory(self, path: Path, *, root: Path, script: str, args: Sequence[str] = (),
                        sync: Sequence[str] = (), grace: str = "10s") -> Path:
        """A clusterrun inventory for these hosts (JSON is YAML): master port auto, strict host keys."""
        data = self.c.inventory_data()
        data["master"] = {"port": "auto"}
        data["job"] = {"root": str(root), "script": script, "args": list(args), "sync": list(sync),
                       "init_method": "env", "backend": "gloo", "timeout": "5m"}
        data["timeouts"] = {"grace": grace}
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path


def _blackhole() -> None:
    """Traffic for 198.18.0.0/15 must never leave this machine, also while a cluster's network is down."""
    subprocess.run(["ip", "route", "add", "blackhole", "198.18.0.0/15"], capture_output=True)


def _route_dev(address: str) -> str:
    out = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True, check=True).stdout
    words = out.split()
    return words[words.index("dev") + 1]


def sh_join(words: Sequence[str]) -> str:
    return shlex.join(list(words))
