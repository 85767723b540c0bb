"""The one fan-out: act on every host in parallel, collect `{host: result | error}`, report every failure
at once (fabric's `Group` → `GroupResult` / `GroupException`).

`fan_out` blocks until every call ended (or `poll` raises, which abandons the calls still running);
`fan_out_background` returns at once and hands each result to a callback as it comes; `on_hosts`
connects to each host first and closes the connection after. Results and errors are keyed by host name
(an inventory's names are unique). A call that raises something other than a HostError (a bug, an
unexpected library error) still names its host.

Every host gets a thread of its own, all started at once, never a pool of fewer: phases wait on each other
across hosts (the claims' barrier, the relay chain laid out, every host's push held until all are ready),
so a call that has not started yet would keep the others waiting until they time out (a pool of 64 did
exactly that above 64 hosts). The threads are daemons (a poll that gives up abandons them).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, TypeVar, Union

from ..errors import HostError, HostsFailed, UnexpectedError

T = TypeVar("T")
POLL_S = 0.05


@dataclass
class GroupResult:
    """Per-host results of one fan-out, by host name; `failed` and `raise_for` keep the hosts' order."""

    results: Dict[str, Any] = field(default_factory=dict)
    errors: Dict[str, HostError] = field(default_factory=dict)
    names: Sequence[str] = ()  # every host, in the order given

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def failed(self) -> Dict[str, HostError]:
        """Host name → error, in the order the hosts were given (not the order they failed in)."""
        return {name: self.errors[name] for name in self.names if name in self.errors}

    def raise_for(self, phase: str) -> None:
        """One HostsFailed naming every host that failed (nothing when all succeeded)."""
        if self.errors:
            raise HostsFailed(phase, self.failed)


def call(fn: Callable[[T], object], item: T, name: str) -> Union[object, HostError]:
    """fn(item), with any exception turned into this host's HostError."""
    try:
        return fn(item)
    except HostError as exc:
        return exc
    except Exception as exc:  # still name the host, and let the other hosts go on
        return UnexpectedError(name, f"{type(exc).__name__}: {exc}")


def fan_out(items: Sequence[T], fn: Callable[[T], object], *, name: Callable[[T], str],
            poll: Optional[Callable[[], None]] = None, thread_name: str = "hosts") -> GroupResult:
    """fn on every item in parallel; `poll` runs every 50 ms meanwhile and may raise to give up waiting."""
    out = GroupResult(names=[name(i) for i in items])
    if len(set(out.names)) != len(out.names):
        raise ValueError(f"fan_out: host names must be unique: {out.names}")
    if not items:
        return out
    ended: "queue.Queue[tuple]" = queue.Queue()
    for item in items:
        start_thread(lambda i=item: ended.put((i, call(fn, i, name(i)))), f"{thread_name}-{name(item)}")
    left = len(items)
    while left:
        try:
            got = [ended.get(timeout=POLL_S if poll else None)]
        except queue.Empty:
            got = []
        while got or not ended.empty():
            item, value = got.pop() if got else ended.get_nowait()
            _keep(out, name(item), value)
            left -= 1
        if poll is not None:
            poll()
    return out


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread running target, started now."""
    thread = threading.Thread(target=target, daemon=True, name=name)
    thread.start()
    return thread


def fan_out_background(items: Sequence[T], fn: Callable[[T], object], *, name: Callable[[T], str],
                       on_each: Callable[[T, Union[object, HostError]], None], thread_name: str = "hosts") -> None:
    """fn on every item, each in a daemon thread of its own; on_each(item, result or HostError) as each ends."""
    for item in items:
        start_thread(lambda i=item: on_each(i, call(fn, i, name(i))), f"{thread_name}-{name(item)}")


def on_hosts(items: Sequence[T], connect: Callable[[Any], Any], fn: Callable[[T, Any], object],
             *, host: Callable[[T], Any] = lambda item: item.host, thread_name: str = "hosts") -> GroupResult:
    """Connect to every item's host and run fn(item, client) there (connect: make_connect's, giving a
    HostClient), all in parallel, each connection closed after; results and errors by host name."""
    def one(item: T) -> object:
        client = connect(host(item))
        try:
            return fn(item, client)
        finally:
            client.close()

    return fan_out(items, one, name=lambda item: host(item).name, thread_name=thread_name)


def background(fn: Callable[..., T], *args: Any, thread_name: str = "background") -> "Future[T]":
    """fn(*args) in a daemon thread of its own, started now: work beside a fan-out (hashing the job while
    the hosts connect). The one other place clusterrun starts a thread."""
    future: "Future[T]" = Future()

    def body() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    start_thread(body, thread_name)
    return future


def _keep(out: GroupResult, name: str, value: object) -> None:
    if isinstance(value, HostError):
        out.errors[name] = value
    else:
        out.results[name] = value
