"""One named cluster of containers posing as SSH hosts: lifecycle (up, down, healthy, status), readiness
(a real SSH login under strict host keys), commands and processes on the hosts."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

from .common import (CLUSTER_ROOT, DEFAULT_HOSTS, DEFAULT_NAME, DEFAULT_SUBNET, FIRST_HOST_OFFSET, LABEL, USER,
                     _NAME_RE, _SESSION_RE, ClusterError, HostInfo, Proc, log)
from .dockercli import _run, compose_argv, docker, docker_bin
from .faults import Faults
from .image import build_image
from .render import Rendering


def _second_subnet(text: str | None, first: ipaddress.IPv4Network, n: int) -> ipaddress.IPv4Network | None:
    if not text:
        return None
    net = ipaddress.ip_network(text, strict=True)
    if net.version != 4 or net.overlaps(first) or FIRST_HOST_OFFSET + n > net.num_addresses - 1:
        raise ClusterError(f"second subnet {net}: IPv4, apart from {first}, room for {n} hosts")
    return net


class Cluster(Faults, Rendering):
    """One named cluster: its containers, its network and its state directory .cluster/NAME/."""

    def __init__(self, name: str = DEFAULT_NAME, hosts: int | None = None, subnet: str | None = None,
                 *, quiet: bool = True, second_subnet: str | None = None):
        """second_subnet: give every host a second interface, on a second bridge network (the network
        tests: two NICs); the inventory's addresses stay on the first."""
        if not _NAME_RE.match(name) or name == "wheelhouse":
            raise ClusterError(f"cluster name {name!r}: use 1-40 of a-z 0-9 _ - (starting alnum), "
                               "not 'wheelhouse'")
        self.name = name
        self.quiet = quiet
        self.state_dir = CLUSTER_ROOT / name
        saved = self._load_state()
        n = hosts if hosts is not None else int(saved.get("hosts", DEFAULT_HOSTS))
        net = ipaddress.ip_network(subnet or saved.get("subnet", DEFAULT_SUBNET), strict=True)
        if net.version != 4:
            raise ClusterError(f"subnet {net}: IPv4 only")
        if n < 1 or FIRST_HOST_OFFSET + n > net.num_addresses - 1:
            raise ClusterError(f"{n} hosts do not fit in {net} (node i is at .{FIRST_HOST_OFFSET}+i)")
        self.subnet = net
        self.network = f"{name}-net"
        self.subnet2 = _second_subnet(second_subnet or saved.get("second_subnet"), net, n)
        self.network2 = f"{name}-net2" if self.subnet2 is not None else ""
        self.hosts = [HostInfo(f"node{i}", str(net.network_address + FIRST_HOST_OFFSET + i), f"{name}-node{i}",
                               str(self.subnet2.network_address + FIRST_HOST_OFFSET + i) if self.subnet2 else "")
                      for i in range(n)]
        self._by_key = {k: h for h in self.hosts for k in (h.name, h.address, h.container)}
        self._blocked: dict[str, set[str]] = {}
        self._renamed: set[str] = set()  # hosts whose /etc/hosts loopback_name() changed
        self._shaped: set[str] = set()  # hosts whose interface shape() capped
        self.timings: dict[str, float] = {}  # of the last up(): image, compose, ssh, total (seconds)

    # paths ----------------------------------------------------------------------------------------
    key_path = property(lambda self: self.state_dir / "id_ed25519")
    known_hosts_path = property(lambda self: self.state_dir / "known_hosts")
    inventory_path = property(lambda self: self.state_dir / "inventory.yaml")
    compose_path = property(lambda self: self.state_dir / "docker-compose.yml")
    ssh_config_path = property(lambda self: self.state_dir / "ssh_config")
    shared_dir = property(lambda self: self.state_dir / "shared")
    hostkeys_dir = property(lambda self: self.state_dir / "hostkeys")
    state_path = property(lambda self: self.state_dir / "state.json")

    def host(self, host: str | HostInfo) -> HostInfo:
        """A host by name (node1), address or container name."""
        if isinstance(host, HostInfo):
            return host
        try:
            return self._by_key[host]
        except KeyError:
            raise ClusterError(f"no host {host!r} in cluster {self.name!r} "
                               f"(hosts: {', '.join(h.name for h in self.hosts)})") from None

    def _load_state(self) -> dict:
        try:
            return json.loads((self.state_dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    # lifecycle ------------------------------------------------------------------------------------
    def up(self, timeout: float = 120.0) -> "Cluster":
        """Build (cached), start every host, wait for SSH logins, write the inventory."""
        t0 = time.monotonic()
        image = build_image(quiet=self.quiet)
        fresh = not self.state_dir.exists()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for d in (self.shared_dir, self.hostkeys_dir):
            d.mkdir(exist_ok=True)
        os.chmod(self.shared_dir, 0o777)  # the hosts' user cr (uid 1000) writes here, whoever we are
        self._ensure_key()
        self._write_atomic(self.compose_path, self.compose_yaml())
        self._image = image
        existed = self._unpause_all()  # compose cannot stop or recreate a paused container
        t1 = time.monotonic()
        cp = self._compose("up", "-d", "--remove-orphans", check=False, timeout=600)
        if cp.returncode != 0:
            err = cp.stderr.strip()
            if fresh and not any(self._states().values()):
                shutil.rmtree(self.state_dir, ignore_errors=True)
            if "overlaps" in err or "Pool overlaps" in err:
                raise ClusterError(f"subnet {self.subnet} is taken by another docker network (another "
                                   f"cluster?): pass --subnet, e.g. 198.18.201.0/24\n{err[-800:]}")
            raise ClusterError(f"compose up failed for cluster {self.name!r}:\n{err[-2000:]}")
        self._write_atomic(self.state_path, json.dumps({
            "version": 1, "name": self.name, "hosts": len(self.hosts), "subnet": str(self.subnet),
            "image": image, "network": self.network, "compose": compose_argv(),
            **({"second_subnet": str(self.subnet2)} if self.subnet2 else {})}, indent=2) + "\n")
        if existed:
            # compose leaves a running container alone, even one a partition() cut off: repair those.
            self.restore(wait=False, deep=True)
        t2 = time.monotonic()
        self.wait_ready(timeout=timeout)
        self._write_atomic(self.inventory_path, self.inventory_yaml())
        self._write_atomic(self.ssh_config_path, self.ssh_config())
        t3 = time.monotonic()
        self.timings = {"image": t1 - t0, "compose": t2 - t1, "ssh": t3 - t2, "total": t3 - t0}
        log.info("cluster %s up: %s", self.name, self.timings)
        return self

    def down(self) -> None:
        """Remove the containers, the network and .cluster/NAME/ (the test key included)."""
        if self.compose_path.exists():
            self._unpause_all()
            # Files the hosts' cr wrote under /shared may not be ours to delete here: empty it inside.
            states = self._states()
            running = [h for h in self.hosts if states.get(h.container, {}).get("Status") == "running"]
            if running:
                self.exec(running[0], ["find", "/shared", "-mindepth", "1", "-delete"], user="root", timeout=60)
            self._compose("down", "-v", "--remove-orphans", "-t", "1", check=False, timeout=300)
        # Whatever compose did not know about (a lost compose file, more hosts than it lists).
        left = docker("ps", "-aq", "--filter", f"label={LABEL}={self.name}", check=False).stdout.split()
        if left:
            docker("rm", "-f", *left, check=False)
        for network in filter(None, (self.network, self.network2)):
            if docker("network", "inspect", network, check=False).returncode == 0:
                docker("network", "rm", network, check=False)
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)

    def healthy(self, timeout: float = 10.0) -> bool:
        """Every host running, attached, and accepting the test key under strict host-key checking."""
        saved = self._load_state()
        if not self._as_saved(saved):
            return False
        if not all(p.exists() for p in (self.key_path, self.known_hosts_path, self.inventory_path)):
            return False
        states = self._states()
        wanted = [n for n in (self.network, self.network2) if n]
        for h in self.hosts:
            st = states.get(h.container)
            if not st or st["Status"] != "running" or not all(n in st["Networks"] for n in wanted):
                return False
            if st["Image"] != saved.get("image"):
                return False
        res = self._ssh_all(self.hosts, ["hostname"], timeout=timeout)
        return all(rc == 0 and out.strip() == h.name for h, (rc, out, _) in zip(self.hosts, res))

    def _as_saved(self, saved: dict) -> bool:
        """The cluster `up` made is this one: as many hosts, the same subnets."""
        return bool(saved) and saved.get("hosts") == len(self.hosts) and saved.get("subnet") == str(self.subnet) \
            and saved.get("second_subnet") == (str(self.subnet2) if self.subnet2 else None)

    def image_current(self) -> bool:
        """Whether the running cluster's image and compose file are what the current sources make."""
        saved = self._load_state()
        try:
            image = build_image(quiet=True)
        except ClusterError:
            return False
        try:
            compose = self.compose_path.read_text()
        except OSError:
            return False
        return saved.get("image") == image and compose == self.compose_yaml()

    def status(self) -> list[dict]:
        states = self._states()
        rows = []
        alive = [h for h in self.hosts if states.get(h.container, {}).get("Status") == "running"
                 and self.network in states[h.container]["Networks"]]
        logins = dict(zip([h.name for h in alive], self._ssh_all(alive, ["true"], timeout=5))) \
            if self.known_hosts_path.exists() else {}
        for h in self.hosts:
            st = states.get(h.container)
            rows.append({
                "name": h.name, "address": h.address, "container": h.container,
                "state": st["Status"] if st else "missing",
                "network": bool(st and self.network in st["Networks"]),
                "ssh": h.name in logins and logins[h.name][0] == 0,
            })
        return rows

    # readiness ------------------------------------------------------------------------------------
    def wait_ready(self, hosts: Iterable[str | HostInfo] | None = None, timeout: float = 60.0) -> float:
        """Wait until each host accepts an SSH login with the test key; return the seconds it took.

        A TCP connect is not enough (docker's proxy or a half-started sshd accept it). Host keys are
        read from what each container published at start, refreshed while we wait (a recreated
        container has a new key), and the login is checked against them, strictly.
        """
        t0 = time.monotonic()
        pending = [self.host(h) for h in (hosts if hosts is not None else self.hosts)]
        last_err: dict[str, str] = {}
        while pending:
            self._refresh_known_hosts()
            res = self._ssh_all(pending, ["hostname"], timeout=5)
            still = []
            for h, (rc, out, err) in zip(pending, res):
                if rc == 0 and out.strip() == h.name:
                    continue
                still.append(h)
                last_err[h.name] = (err.strip() or out.strip() or f"exit {rc}")[-300:]
            pending = still
            if not pending:
                break
            if time.monotonic() - t0 > timeout:
                states = self._states()
                lines = []
                for h in pending:
                    st = states.get(h.container, {}).get("Status", "missing")
                    logs = docker("logs", "--tail", "5", h.container, check=False)
                    lines.append(f"  {h.name} ({h.address}, container {st}): {last_err.get(h.name)}\n"
                                 f"    docker logs: {(logs.stdout + logs.stderr).strip()[-400:]}")
                raise ClusterError(f"cluster {self.name!r}: no SSH login after {timeout:.0f} s on\n"
                                   + "\n".join(lines))
            time.sleep(0.1)
        return time.monotonic() - t0

    def _refresh_known_hosts(self) -> None:
        lines = []
        for h in self.hosts:
            p = self.hostkeys_dir / f"{h.name}.pub"
            try:
                keytype, b64 = p.read_text().split()[:2]
            except (OSError, ValueError):
                continue
            lines.append(f"{h.address} {keytype} {b64}\n")
        text = "".join(lines)
        try:
            if self.known_hosts_path.read_text() == text:
                return
        except OSError:
            pass
        self._write_atomic(self.known_hosts_path, text)

    def ssh_argv(self, host: str | HostInfo, command: Sequence[str] | str = (), *,
                 connect_timeout: float = 5) -> list[str]:
        """An OpenSSH command line that logs in as cr with the test key, host keys checked strictly."""
        h = self.host(host)
        argv = ["ssh", "-F", "/dev/null", "-i", str(self.key_path), "-l", USER,
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts_path}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", f"ConnectTimeout={max(1, int(connect_timeout))}", "-o", "LogLevel=ERROR", h.address]
        if command:
            argv += ["--", command if isinstance(command, str) else shlex.join(command)]
        return argv

    def ssh(self, host: str | HostInfo, command: Sequence[str] | str, timeout: float = 60,
            input: str | None = None) -> tuple[int, str, str]:
        """Run a command over a real SSH login; return (rc, stdout, stderr); rc 255 is ssh's own."""
        try:
            cp = _run(self.ssh_argv(host, command, connect_timeout=min(timeout, 5)), check=False,
                      timeout=timeout, input=input)
        except ClusterError as exc:  # the timeout
            return 255, "", str(exc)
        return cp.returncode, cp.stdout, cp.stderr

    def _ssh_all(self, hosts: Sequence[HostInfo], command: Sequence[str], timeout: float):
        if not hosts:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            return list(pool.map(lambda h: self.ssh(h, command, timeout=timeout), hosts))

    # processes ------------------------------------------------------------------------------------
    def exec(self, host: str | HostInfo, argv: Sequence[str], user: str = USER,
             timeout: float | None = 60, input: str | None = None) -> tuple[int, str, str]:
        """`docker exec` argv on a host as cr or root (no SSH involved); return (rc, stdout, stderr)."""
        h = self.host(host)
        cmd = [docker_bin(), "exec"] + (["-i"] if input is not None else []) + ["-u", user]
        if user == USER:
            cmd += ["-w", f"/home/{USER}", "-e", f"HOME=/home/{USER}"]
        try:
            cp = _run(cmd + [h.container, *argv], check=False, timeout=timeout, input=input)
        except ClusterError as exc:  # the timeout
            return 124, "", str(exc)
        return cp.returncode, cp.stdout, cp.stderr

    def processes(self, host: str | HostInfo) -> list[Proc]:
        """Every process of user cr on the host, sshd's session processes included."""
        h = self.host(host)
        rc, out, err = self.exec(h, ["ps", "-u", USER, "-o", "pid=,ppid=,pgid=,stat=,args="],
                                 user="root", timeout=30)
        if rc not in (0, 1):  # ps exits 1 when it selected nothing
            raise ClusterError(f"{h.name}: ps failed (exit {rc}): {err.strip()}")
        procs = []
        for line in out.splitlines():
            parts = line.split(None, 4)
            if len(parts) < 4:
                continue
            pid, ppid, pgid, stat = parts[:4]
            procs.append(Proc(h.name, int(pid), int(ppid), int(pgid), stat, parts[4] if len(parts) > 4 else ""))
        return procs

    def orphans(self, hosts: Iterable[str | HostInfo] | None = None) -> list[Proc]:
        """Processes of cr left on the hosts, except sshd's own session processes.

        Hosts that are not running (crashed) or paused are skipped: nothing can be asked of them.
        """
        states = self._states()
        targets = [self.host(h) for h in (hosts if hosts is not None else self.hosts)]
        targets = [h for h in targets if states.get(h.container, {}).get("Status") == "running"]
        if not targets:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
            per_host = list(pool.map(self.processes, targets))
        return [p for procs in per_host for p in procs if not _SESSION_RE.match(p.args)]

    def kill(self, host: str | HostInfo, pids: Iterable[int], signal: str = "KILL") -> None:
        """Signal processes on a host by pid (as root), ignoring those already gone."""
        pids = [str(int(p)) for p in pids]
        if pids:
            self.exec(host, ["kill", "-s", signal, "--", *pids], user="root", timeout=30)

    # internals ------------------------------------------------------------------------------------
    def _states(self) -> dict[str, dict]:
        """container name -> {Status, Image, Networks: {network: address}} for this cluster's hosts."""
        names = [h.container for h in self.hosts]
        fmt = ('{"Name": {{json .Name}}, "Status": {{json .State.Status}}, "Image": {{json .Config.Image}}, '
               '"Networks": {{json .NetworkSettings.Networks}}}')
        cp = docker("inspect", "--format", fmt, *names, check=False, timeout=60)
        out: dict[str, dict] = {}
        for line in cp.stdout.splitlines():
            if not line.strip():
                continue
            d = json.loads(line)
            nets = {k: (v or {}).get("IPAddress", "") for k, v in (d["Networks"] or {}).items()}
            out[d["Name"].lstrip("/")] = {"Status": d["Status"], "Image": d["Image"], "Networks": nets}
        return out

    def _unpause_all(self) -> bool:
        """Unpause this cluster's paused containers; return whether it has any container at all."""
        states = self._states()
        for name, st in states.items():
            if st["Status"] == "paused":
                docker("unpause", name, check=False)
        return bool(states)

    def _compose(self, *args: str, **kw) -> subprocess.CompletedProcess:
        image = getattr(self, "_image", None) or self._load_state().get("image") or "clusterrun/host:latest"
        env = self.compose_env(image) if self.key_path.with_suffix(".pub").exists() else {}
        return _run(compose_argv() + ["-p", self.name, "-f", str(self.compose_path), *args], env=env, **kw)

    def _ensure_key(self) -> None:
        if self.key_path.exists() and self.key_path.with_suffix(".pub").exists():
            return
        for p in (self.key_path, self.key_path.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"clusterrun-test@{self.name}",
              "-f", str(self.key_path)])
        os.chmod(self.key_path, 0o600)

    @staticmethod
    def _write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
