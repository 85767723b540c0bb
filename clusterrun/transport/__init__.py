"""How the controller runs commands on a host: over SSH (paramiko) or, for `connection: local`, here.

Both speak argv (never a shell line built by formatting): SSH renders it with `shlex.join` at the
boundary, local passes it to `subprocess` as a list. Everything above this package is the same code
for both, which is what makes a local run a faithful twin of a remote one.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

from ..errors import CommandTimeout, ConnectError
from ..remote.host.wire import read_exact as _read_exact

# paramiko.config imports invoke (for `Match exec`, which clusterrun evaluates itself: config/ssh_config.py
# and transport/openssh.py), and invoke imports unittest.mock: 40 of paramiko's 120 ms of import on every
# launch, for nothing. A None in sys.modules makes that import fail as paramiko expects when invoke is not
# installed. Set before any module of this package imports paramiko; a process that already imported
# invoke keeps it.
if "invoke" not in sys.modules and "paramiko" not in sys.modules:
    sys.modules["invoke"] = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Completed:
    exit_code: int
    stdout: bytes
    stderr: bytes


class StreamClosed(Exception):
    """The other end of a stream went away (connection lost, or the remote process ended). Internal, not a
    ClusterrunError: what a Stream raises; a host call translates it into the host's ConnectError (with the
    stderr tail) in one place, hosts/failures.py, and Transport.run in run_on below."""


class Stream(Protocol):
    """A running remote command with its stdin, stdout and exit status."""

    def write(self, data: bytes, timeout: Optional[float] = None) -> None:
        """All of data; TimeoutError if the other end stops taking it for timeout seconds."""

    def close_stdin(self) -> None: ...

    def read(self, n: int, timeout: Optional[float]) -> bytes:
        """Up to n bytes; b"" at end of output; raises TimeoutError when nothing came in time."""

    def wait(self, timeout: Optional[float]) -> int: ...

    def stderr(self) -> bytes: ...

    def close(self) -> None: ...


class Tunnel(Protocol):
    """A TCP connection to localhost:PORT on the host (the far end of `ssh -L`), driven by one select loop:
    it has a fileno, and neither recv nor send blocks."""

    def fileno(self) -> int: ...

    def recv(self, n: int) -> bytes:
        """What arrived (call when select says readable); b"" once the far end closed."""

    def send(self, data: bytes) -> int:
        """How much of data it took now (0: none; come back when writable)."""

    def writable(self) -> bool: ...

    def shutdown_write(self) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    label: str  # host name, for messages

    def open(self, argv: Sequence[str]) -> Stream: ...

    def run(self, argv: Sequence[str], *, stdin: Optional[bytes] = None, timeout: float) -> Completed: ...

    def tunnel(self, port: int) -> Tunnel:
        """A connection to localhost:PORT on the host; ConnectError when nothing answers there."""

    def close(self) -> None: ...


def read_exact(stream: Stream, n: int, timeout: Optional[float]) -> bytes:
    """Exactly n bytes, or StreamClosed if the output ends first (the host program's loop: one for both)."""
    return _read_exact(lambda k: stream.read(k, timeout), n, lambda: StreamClosed("end of output"))


def run_on(transport: Transport, argv: Sequence[str], *, stdin: Optional[bytes], timeout: float) -> Completed:
    """Run argv to completion within timeout (the shared body of every Transport.run)."""
    deadline = time.monotonic() + timeout
    stream = transport.open(argv)
    try:
        try:
            if stdin:
                stream.write(stdin, timeout)
            stream.close_stdin()
        except StreamClosed:
            pass  # it exited without reading; its output says why
        out = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            chunk = stream.read(1 << 16, left)
            if not chunk:
                break
            out.append(chunk)
        code = stream.wait(max(0.1, deadline - time.monotonic()))
        return Completed(code, b"".join(out), stream.stderr())
    except TimeoutError:
        raise CommandTimeout(transport.label, f"no answer within {timeout:g} s",
                             command=" ".join(argv[:1] + ["..."])) from None
    except StreamClosed as exc:
        raise ConnectError(transport.label, f"connection lost: {exc}") from None
    finally:
        stream.close()
