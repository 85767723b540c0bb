"""`clusterrun exec`: one command on every host in parallel, over the same connections a launch makes
(host keys, ~/.ssh/config, ProxyJump), its argv quoted at the boundary like every command clusterrun runs."""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass
from typing import Callable, List, Sequence

from ..config.inventory import Host
from ..errors import RemoteCommandError, UsageError
from .client import HostClient
from .group import GroupResult, fan_out


@dataclass(frozen=True)
class HostOutput:
    host: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    seconds: float

    @property
    def text(self) -> bytes:
        """What a person reads: stdout, then stderr."""
        return self.stdout + self.stderr

    def to_json(self) -> dict:
        return {"host": self.host, "exit_code": self.exit_code, "stdout": self.stdout.decode("utf-8", "replace"),
                "stderr": self.stderr.decode("utf-8", "replace"), "seconds": round(self.seconds, 3)}


def select_hosts(hosts: Sequence[Host], names: str) -> List[Host]:
    """--hosts a,b: the named hosts in inventory order; an unknown name is a usage error."""
    if not names:
        return list(hosts)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {h.name for h in hosts}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise UsageError(f"--hosts: no host {unknown[0]!r} in the inventory" +
                         (f"; did you mean {close[0]!r}?" if close else f" (hosts: {', '.join(sorted(known))})"))
    return [h for h in hosts if h.name in wanted]


def run_everywhere(hosts: Sequence[Host], connect: Callable[[Host], HostClient], argv: Sequence[str],
                   timeout: float) -> GroupResult:
    """argv on every host at once; results (HostOutput) and connection errors by host name."""
    def one(host: Host) -> HostOutput:
        t0 = time.monotonic()
        client = connect(host)
        try:
            done = client.transport.run(list(argv), timeout=timeout)
        except RemoteCommandError as exc:
            if exc.command_exit != 127:
                raise
            # a local host that has no such program: what a shell over SSH says too
            return HostOutput(host.name, 127, b"", f"{exc.message}\n".encode(), time.monotonic() - t0)
        finally:
            client.close()
        return HostOutput(host.name, done.exit_code, done.stdout, done.stderr, time.monotonic() - t0)

    return fan_out(list(hosts), one, name=lambda h: h.name, thread_name="exec")
