"""ProxyCommand as OpenSSH runs it: through the shell (`/bin/sh -c "exec COMMAND"`, so pipes, quotes and
`$VARS` mean what they mean in ~/.ssh/config), its stderr kept in a file rather than a pipe nobody reads
(a chatty proxy would otherwise fill the pipe and stall), and shown when the connection fails."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time

import paramiko

from .waiting import ready

STDERR_SHOWN = 2000


class ShellProxyCommand(paramiko.ProxyCommand):
    """paramiko's ProxyCommand socket (send/recv/close), started the way OpenSSH starts one."""

    def __init__(self, command_line: str):  # not super().__init__: it splits the line itself, no shell
        self.cmd = ["/bin/sh", "-c", "exec " + command_line]
        self.command_line = command_line
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, bufsize=0, start_new_session=True)
        self.timeout = None

    def recv(self, size: int) -> bytes:
        """paramiko's, with poll() for its select(): past 1023 open files select refuses the pipe."""
        buffer = b""
        start = time.monotonic()
        fd = self.process.stdout.fileno()
        while len(buffer) < size:
            left = None if self.timeout is None else self.timeout - (time.monotonic() - start)
            if left is not None and left <= 0:
                if buffer:
                    return buffer
                raise socket.timeout()
            try:
                chunk = os.read(fd, size - len(buffer)) if ready(fd, left) else None
            except OSError as exc:
                raise paramiko.ProxyCommandFailure(" ".join(self.cmd), exc.strerror) from None
            if chunk == b"":  # the proxy ended: b"" as a closed socket says (paramiko's loops on it)
                return buffer
            buffer += chunk or b""
        return buffer

    def stderr_tail(self) -> str:
        """The last of what the proxy printed on stderr (its reason, when it failed)."""
        try:
            size = os.fstat(self._stderr.fileno()).st_size
            self._stderr.seek(max(0, size - STDERR_SHOWN))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        """Idempotent (paramiko's transport thread closes its socket too): TERM the proxy if it still runs
        (`closed` is paramiko's: the process has ended)."""
        if self.process.poll() is None:
            try:
                self.process.terminate()
                self.process.wait(timeout=2)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass

