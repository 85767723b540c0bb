"""A host call's failures as clusterrun's errors, translated here and nowhere else (every host call in
hosts/ goes through it, as every call goes through HostClient._with_program for a missing program):

- the host said nothing in time (TimeoutError) → CommandTimeout, exit 3, quoting what the host program
  wrote to stderr meanwhile (a wait for a lock says so there) where the caller hands over its stream;
- the stream ended under the call (StreamClosed: the connection dropped, or the host program exited) →
  ConnectError, with the tail of the host program's stderr where the caller hands over its stream;
- the host program answered `{"error", "path"}` (remote/host/wire.py `Fail`) → RemoteCommandError.

Each caller names its exchange ("push: no answer within 30 s", "connection lost while starting"), so the
words stay where the protocol is. ProgramMissing and HostErrors pass through untouched.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from ..errors import CommandTimeout, ConnectError, HostError, RemoteCommandError
from ..transport import Stream, StreamClosed

TAIL = 500  # the characters of the host program's stderr a lost connection quotes


def failure(exc: BaseException, label: str, *, silent: str = "", lost: str = "", command: str = "",
            stream: Optional[Stream] = None) -> BaseException:
    """The error a host call's TimeoutError or StreamClosed is: CommandTimeout(silent), or
    ConnectError(`LOST: EXC[: STDERR TAIL]`); anything else is itself."""
    if not isinstance(exc, (TimeoutError, StreamClosed)):
        return exc  # its stream's stderr left unread, for whoever handles it
    tail = _tail(stream)
    if isinstance(exc, TimeoutError):  # what it said meanwhile (a wait for a lock, remote/host/wire.note)
        return CommandTimeout(label, silent + (f"; it said: {tail}" if tail else ""), command=command)
    return ConnectError(label, f"{lost}: {exc}" + (f": {tail}" if tail else ""))


def _tail(stream: Optional[Stream]) -> str:
    """The last characters of what the host program wrote to stderr so far ("" without a stream)."""
    if stream is None:
        return ""
    try:
        return stream.stderr().decode("utf-8", "replace").strip()[-TAIL:]
    except Exception:  # noqa: BLE001 -- a message is being made: never fail it
        return ""


@contextmanager
def exchange(label: str, *, silent: str, lost: str, command: str = "",
             stream: Optional[Stream] = None) -> Iterator[None]:
    """One exchange with a host (a write, a read, a conversation): its TimeoutError and StreamClosed
    raised as the errors `failure` makes of them."""
    try:
        yield
    except (TimeoutError, StreamClosed) as exc:
        raise failure(exc, label, silent=silent, lost=lost, command=command, stream=stream) from None


def error_answer(label: str, error: str, *, what: str = "", path: str = "",
                 exit_code: Optional[int] = None) -> HostError:
    """The host program's {"error"} answer: RemoteCommandError(`WHAT: ERROR (PATH)`)."""
    text = (f"{what}: " if what else "") + error + (f" ({path})" if path else "")
    return RemoteCommandError(label, text, exit_code=exit_code)
