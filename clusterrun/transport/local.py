"""`connection: local`: the same host-side commands, run as child processes of the controller."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import tempfile
from typing import Optional, Sequence

from ..errors import ConnectError, RemoteCommandError
from . import Completed, StreamClosed, run_on


# What a local host program gets of the controller's environment: what an SSH login would give it (and
# the GPU selection people set on their workstation), not the controller's tokens and settings.
PASSED_ENV = ("HOME", "USER", "LOGNAME", "PATH", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
              "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def host_environment(environ=None) -> dict:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in PASSED_ENV or k.startswith("LC_")}


class LocalStream:
    def __init__(self, argv: Sequence[str]):
        self._err = tempfile.TemporaryFile()
        # Own session: a Ctrl-C in the terminal reaches the controller only, which then stops the run in order.
        self._proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                      start_new_session=True, close_fds=True, env=host_environment())
        self._out_fd = self._proc.stdout.fileno()

    def write(self, data: bytes, timeout: Optional[float] = None) -> None:
        # a local child cannot hang the way a paused host can: no deadline needed
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._proc.stdin.fileno(), view[:1 << 20])
                view = view[n:]
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise StreamClosed(str(exc)) from None

    def close_stdin(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass

    def read(self, n: int, timeout: Optional[float]) -> bytes:
        ready, _, _ = select.select([self._out_fd], [], [], timeout)
        if not ready:
            raise TimeoutError
        return os.read(self._out_fd, n)

    def wait(self, timeout: Optional[float]) -> int:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError from None

    def stderr(self) -> bytes:
        self._err.seek(0)
        return self._err.read()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()  # our own child, by its pid
            self._proc.wait()
        for fh in (self._proc.stdin, self._proc.stdout):
            try:
                fh.close()
            except OSError:
                pass
        self._err.close()


class LocalTunnel:
    """A plain TCP connection to localhost:PORT here, non-blocking for one select loop."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def recv(self, n: int) -> bytes:
        try:
            return self._sock.recv(n)
        except BlockingIOError:
            raise
        except OSError:  # reset: the end, as for a channel
            return b""

    def send(self, data: bytes) -> int:
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0

    def writable(self) -> bool:
        poller = select.poll()  # not select(): it fails past fd 1023
        poller.register(self._sock, select.POLLOUT)
        return bool(poller.poll(0))

    def shutdown_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._sock.close()


class LocalTransport:
    def __init__(self, label: str):
        self.label = label

    def tunnel(self, port: int) -> LocalTunnel:
        try:
            return LocalTunnel(socket.create_connection(("localhost", port), timeout=5.0))
        except OSError as exc:
            raise ConnectError(self.label, f"nothing answers on localhost:{port} there "
                                           f"({exc.strerror or exc})") from None

    def open(self, argv: Sequence[str]) -> LocalStream:
        try:
            return LocalStream(argv)
        except OSError as exc:  # what a shell would report as exit 127 over SSH
            raise RemoteCommandError(self.label, f"cannot run {argv[0]}: {exc.strerror or exc}", exit_code=127,
                                     command=argv[0],
                                     hint="install Python 3 there, or set python: in the inventory") from None

    def run(self, argv: Sequence[str], *, stdin: Optional[bytes] = None, timeout: float) -> Completed:
        return run_on(self, argv, stdin=stdin, timeout=timeout)

    def close(self) -> None:
        pass
