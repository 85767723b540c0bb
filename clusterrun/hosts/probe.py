"""Running remote/probe.py on a host without installing it: its source goes to `python -` on stdin.

The options travel on stdin too, as a first line of the program (`OPTIONS = '<json>'`): the host's
`env:` is among them, and env values stay off command lines that `ps` shows. Answers are JSON lines;
each is kept with its arrival time (the clock check needs it). Anything a login shell prints before
the first answer is kept apart as noise.
"""

from __future__ import annotations

import json
import secrets
import os
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import HostError
from ..transport import Stream, StreamClosed, Transport
from ..remote.host.env.fingerprint import PROBE as FINGERPRINT_PROBE  # the stack fingerprint, as a launch reads it
from .failures import exchange, failure

_REMOTE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "remote")


def _source(*parts: str) -> str:
    with open(os.path.join(_REMOTE, *parts), encoding="utf-8") as fh:
        return fh.read()


# the interface choice, a port's holder and the GPU preflight ride along as source: check finds them
# exactly as a launch's push (and its GPU preflight) does
PROBE_SOURCE: bytes = (f"TORCH_SNIPPET = {_source('torch_probe.py')!r}\n"
                       f"STACK_SNIPPET = {FINGERPRINT_PROBE!r}\n"
                       f"IFACES_SOURCE = {_source('host', 'net', 'ifaces.py')!r}\n"
                       f"HOLDER_SOURCE = {_source('host', 'net', 'holder.py')!r}\n"
                       f"GPU_SOURCE = {_source('host', 'share', 'gpu_health.py')!r}\n" + _source("probe.py")).encode()

# Stops the listener by pid only while that pid still runs the listener we started (its argv holds a
# random tag), so a pid reused in the meantime is never signalled.
STOP_LISTENER = ("import os,signal,sys;p=int(sys.argv[1]);f='/proc/%d/cmdline'%p;"
                 "c=open(f,'rb').read() if os.path.exists(f) else b'';"
                 "(sys.argv[2].encode() in c or not os.path.isdir('/proc/self')) and os.kill(p,signal.SIGTERM)")


def probe_program(opts: dict) -> bytes:
    return b"OPTIONS = " + repr(json.dumps(opts)).encode() + b"\n" + PROBE_SOURCE


def probe_argv(python: str, command: str) -> List[str]:
    return [python, "-", command]


@dataclass(frozen=True)
class ProbeAnswer:
    sent: float  # wall clock when the program was handed over (for the clock check)
    lines: Tuple[Tuple[float, dict], ...]  # (arrival wall clock, answer)
    noise: str  # what came before the first answer (a chatty login shell)
    exit_code: Optional[int]
    stderr: str

    def find(self, key: str) -> Optional[Tuple[float, dict]]:
        return next(((t, d) for t, d in self.lines if key in d), None)


class LineReader:
    """Lines of a stream as they arrive, each stamped with time.time() at arrival."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self._buf = b""
        self.ended = False

    def next(self, deadline: float) -> Optional[Tuple[float, str]]:
        """The next line; None at the end of the output; TimeoutError at the (monotonic) deadline."""
        while b"\n" not in self._buf:
            if self.ended:
                if self._buf:
                    line, self._buf = self._buf, b""
                    return time.time(), line.decode("utf-8", "replace")
                return None
            now = time.monotonic()
            if now > deadline + 1.0:
                raise TimeoutError
            # just past the deadline, still take what already arrived (0: a read that does not wait)
            chunk = self.stream.read(1 << 16, max(0.0, deadline - now))
            if not chunk:
                self.ended = True
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return time.time(), line.decode("utf-8", "replace")


def _as_answer(line: str) -> Optional[dict]:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def start_probe(transport: Transport, argv: Sequence[str], opts: dict) -> Tuple[Stream, float]:
    stream = transport.open(argv)  # a missing local python: RemoteCommandError, exit 127 (as a shell says)
    try:
        stream.write(probe_program(opts), 30.0)
    except StreamClosed:
        pass  # it ended without reading (no such Python): its exit code and stderr say why
    except TimeoutError as exc:
        stream.close()
        raise failure(exc, transport.label, silent="the host stopped reading the probe") from None
    stream.close_stdin()
    return stream, time.time()


def read_answers(reader: LineReader, deadline: float, *, until: str = "") -> Tuple[List[Tuple[float, dict]], str]:
    """Answers up to the end of output (or up to and including the first holding `until`), and the noise."""
    lines: List[Tuple[float, dict]] = []
    noise: List[str] = []
    while True:
        got = reader.next(deadline)
        if got is None:
            return lines, "\n".join(noise)
        answer = _as_answer(got[1])
        if answer is None:
            if not lines:
                noise.append(got[1])
            continue
        lines.append((got[0], answer))
        if until and until in answer:
            return lines, "\n".join(noise)


class Started:
    """A probe running on a host; `early` reads the first answers as they come (stamped on arrival)."""

    def __init__(self, transport: Transport, python: str, command: str, opts: dict):
        self.transport = transport
        self.command = command
        self.stream, self.sent = start_probe(transport, probe_argv(python, command), opts)
        self.reader = LineReader(self.stream)
        self.lines: List[Tuple[float, dict]] = []
        self.noise = ""

    def early(self, until: str, deadline: float) -> None:
        """Read up to the first answer holding `until` now, so its arrival time is true."""
        try:
            self.lines, self.noise = read_answers(self.reader, deadline, until=until)
        except (TimeoutError, StreamClosed):
            pass  # collect() reports it

    def close(self) -> None:
        self.stream.close()

    def collect(self, deadline: float) -> ProbeAnswer:
        """Read to the end (monotonic deadline) and close."""
        try:
            with exchange(self.transport.label, silent=f"the {self.command} probe gave no answer in time",
                          lost=f"connection lost during the {self.command} probe", command=f"python - {self.command}"):
                more, noise = read_answers(self.reader, deadline)
                lines = self.lines + more
                try:
                    code: Optional[int] = self.stream.wait(max(0.1, min(2.0, deadline - time.monotonic())))
                except TimeoutError:
                    code = None
                return ProbeAnswer(self.sent, tuple(lines), self.noise if self.lines else noise, code,
                                   self.stream.stderr().decode("utf-8", "replace"))
        finally:
            self.stream.close()


def run_probe(transport: Transport, python: str, command: str, opts: dict, timeout: float) -> ProbeAnswer:
    """Run one probe command to its end within timeout, keeping each line's arrival time."""
    deadline = time.monotonic() + timeout
    return Started(transport, python, command, opts).collect(deadline)


class Listener:
    """The probe's `listen` on rank 0's host: bound to the master port while the other hosts connect."""

    def __init__(self, transport: Transport, python: str, opts: dict, timeout: float):
        self._transport = transport
        self._python = python
        self._tag = "cr-" + secrets.token_hex(8)  # in its argv, so STOP_LISTENER knows it is still ours
        self._stream, _ = start_probe(transport, probe_argv(python, "listen") + [self._tag], opts)
        self._reader = LineReader(self._stream)
        self.peers: List[Tuple[str, str]] = []  # (address, name) of each connection it accepted
        self.ready: dict = {}
        self.error = ""
        try:
            lines, _ = read_answers(self._reader, time.monotonic() + timeout, until="ready")
        except TimeoutError:
            lines = []
            self.error = f"the listener did not start within {timeout:g} s"
        except StreamClosed as exc:
            lines = []
            self.error = f"connection lost: {exc}"
        if lines and "ready" in lines[-1][1]:
            self.ready = lines[-1][1]
        elif not self.error:
            tail = self._stream.stderr().decode("utf-8", "replace").strip().splitlines()[-1:]
            self.error = "the listener did not start" + (f": {tail[0]}" if tail else "")

    @property
    def port(self) -> Optional[int]:
        bound = self.ready.get("port") or {}
        return bound.get("port") if bound.get("free") else None

    def finish(self, expect: Sequence[str], wait: float) -> None:
        """Collect the names it saw (waiting up to `wait` s for `expect`), then stop it."""
        deadline = time.monotonic() + wait
        try:
            while self.ready and not self._reader.ended and not set(expect) <= {n for _, n in self.peers}:
                self._take(deadline)
        except (TimeoutError, StreamClosed):
            pass
        try:
            if self.ready and not self._reader.ended:
                self._transport.run([self._python, "-c", STOP_LISTENER, str(self.ready["pid"]), self._tag],
                                    timeout=10.0)
                end = time.monotonic() + 5.0
                while not self._reader.ended:
                    self._take(end)
        except (TimeoutError, StreamClosed, HostError):
            pass
        finally:
            self._stream.close()

    def _take(self, deadline: float) -> None:
        got = self._reader.next(deadline)
        answer = _as_answer(got[1]) if got else None
        if answer and "peer" in answer:
            self.peers.append((answer["peer"], answer.get("name", "")))


def reach(transport: Transport, host, node_rank: int, listener: object, master_addr: str, shared_file: Optional[str],
           token: str, connect_timeout: float, timeout: float, peer: Optional[dict] = None) -> Optional[dict]:
    """The connection to rank 0's listener and the read of its token file, while both exist; and the one
    to the next host of the relay chain (peer: its addr and listening port)."""
    written = isinstance(listener, Listener) and (listener.ready.get("shared") or {}).get("status") == "ok"
    opts = {"master_addr": master_addr, "port": listener.port if isinstance(listener, Listener) else None,
            "connect_timeout": connect_timeout, "name": host.name,
            "shared_file": shared_file if written and node_rank else None, "token": token, "peer": peer}
    if not opts["port"] and not opts["shared_file"] and not peer:
        return None
    try:
        found = run_probe(transport, host.python, "reach", opts, timeout=timeout).find("reach")
    except HostError as exc:
        return {"connect": {"status": "error", "error": f"{exc.reason}: {exc.message}"}}
    return found[1]["reach"] if found else None
