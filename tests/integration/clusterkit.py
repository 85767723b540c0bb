"""The integration lane's support library: SSH to the container cluster's hosts as its user (paramiko,
strict host keys), processes started over it, and the clusterrun CLI run against the cluster with a
private state dir. conftest.py makes fixtures of them (`ssh`, `cr`)."""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from pathlib import Path

import testcluster  # docker/ is on pytest's pythonpath: see pyproject.toml


class RemoteProcess:
    """A command started over an SSH exec channel; its shell's pid is its process group id."""

    def __init__(self, conn: "Conn", command: str):
        self.conn = conn
        self.command = command
        self.chan = conn.client.get_transport().open_session()
        self.chan.set_combine_stderr(True)
        # sshd makes the command's shell a session (and group) leader: its pid names the group.
        self.chan.exec_command(f"echo $$; exec {command}")
        self._file = self.chan.makefile("r")
        self.chan.settimeout(30)
        self.pid = int(self._file.readline())
        self.lines: list[str] = []

    def readline(self, timeout: float = 30) -> str:
        """The next line of output ('' at the end); socket.timeout if none comes in time."""
        self.chan.settimeout(timeout)
        line = self._file.readline()
        if line:
            self.lines.append(line)
        return line

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        """Wait for the exit; return (exit status, all output after the pid line)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.conn.host.name}: still running after {timeout}s: {self.command}")
            try:
                if not self.readline(timeout=left):
                    break
            except socket.timeout:
                continue
        return self.chan.recv_exit_status(), "".join(self.lines)

    def kill(self) -> None:
        """SIGKILL the process group unless it is gone, then close the channel."""
        if not self.chan.exit_status_ready():
            self.conn.cluster.exec(self.conn.host, ["kill", "-KILL", "--", f"-{self.pid}"], user="root")
        self.chan.close()


class Conn:
    """One paramiko connection to a host as cr, with the test key and the generated known_hosts."""

    def __init__(self, cluster, host, client):
        self.cluster = cluster
        self.host = cluster.host(host)
        self.client = client
        self.spawned: list[RemoteProcess] = []

    def run(self, command: str | list[str], timeout: float = 60) -> tuple[int, str, str]:
        """Run to completion; return (exit status, stdout, stderr)."""
        if not isinstance(command, str):
            command = shlex.join(command)
        _, out, err = self.client.exec_command(command, timeout=timeout)
        o, e = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        return out.channel.recv_exit_status(), o, e

    def spawn(self, command: str) -> RemoteProcess:
        """Start a shell command and return at once; the fixture kills it at teardown if it lives."""
        p = RemoteProcess(self, command)
        self.spawned.append(p)
        return p


def connect(cluster, host, *, known_hosts=None, key_filename=None, username=None, timeout=10):
    """A paramiko client logged in to host, host keys checked strictly (RejectPolicy)."""
    import paramiko

    h = cluster.host(host)
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or cluster.known_hosts_path))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(h.address, port=22, username=username or testcluster.USER,
                       key_filename=str(key_filename or cluster.key_path), look_for_keys=False,
                       allow_agent=False, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
    except BaseException:
        client.close()
        raise
    return client


class SSH:
    """The `ssh` fixture: ssh(host) -> Conn; ssh.client(host, ...) -> a bare paramiko client."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.conns: list[Conn] = []
        self.clients: list = []

    def __call__(self, host) -> Conn:
        conn = Conn(self.cluster, host, self.client(host))
        self.conns.append(conn)
        return conn

    def client(self, host, **overrides):
        """connect() with known_hosts/key_filename/username/timeout overridden; closed at teardown."""
        c = connect(self.cluster, host, **overrides)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for conn in self.conns:
            for p in conn.spawned:
                try:
                    p.kill()
                except Exception:  # the host may be crashed or cut off by the test: restore handles it
                    pass
        for c in self.clients:
            c.close()


JOBS = Path(__file__).resolve().parent / "jobs"


class CR:
    """The `cr` fixture: the clusterrun CLI with a private state dir, and inventories for the cluster."""

    jobs = JOBS  # tests/integration/jobs: the scripts the tests run

    def __init__(self, cluster, tmp_path: Path, home: Path):
        self.cluster = cluster
        self.tmp = tmp_path
        # retention (a background `clean` after each launch) only where a test asks for it: it would show up
        # as a process of the test user in the orphan checks
        self.env = {**os.environ, "CLUSTERRUN_HOME": str(home), "NO_COLOR": "1", "CLUSTERRUN_NO_RETENTION": "1"}

    def inventory(self, name: str = "inv.yaml", *, hosts: int | None = None, job: dict | None = None,
                  defaults: dict | None = None, top: dict | None = None, edit_hosts=None) -> Path:
        """The cluster's own inventory with changes; job defaults to tests/integration/jobs/worker.py."""
        import yaml

        data = yaml.safe_load(Path(self.cluster.inventory_path).read_text())
        if hosts is not None:
            data["hosts"] = data["hosts"][:hosts]
        data["job"] = {**data["job"], "root": str(JOBS), "script": "worker.py", "args": [], "sync": [],
                       "timeout": "60s", **(job or {})}
        data["defaults"].update(defaults or {})
        data.update(top or {})
        data.setdefault("timeouts", {"grace": "3s", "host_lost": "6s", "connect": "5s", "command": "20s"})
        if edit_hosts:
            edit_hosts(data["hosts"])
        path = self.tmp / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def argv(self, *args) -> list[str]:
        return [sys.executable, "-m", "clusterrun", *map(str, args)]

    def run(self, *args, timeout: float = 180):
        import subprocess

        return subprocess.run(self.argv(*args), capture_output=True, encoding="utf-8", errors="replace",
                              env=self.env, timeout=timeout)

    def popen(self, *args):
        import subprocess

        return subprocess.Popen(self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                encoding="utf-8", errors="replace", env=self.env)

    def ps(self) -> list[dict]:
        import json

        done = self.run("ps", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def run_dirs(self, host) -> list[str]:
        rc, out, _ = self.cluster.exec(host, ["sh", "-c", "ls ~/.clusterrun/runs 2>/dev/null || true"])
        return out.split()
