"""The one fan-out: act on every host in parallel, collect `{host: result | error}`, report every failure
at once (fabric's `Group` → `GroupResult` / `GroupException`).

`fan_out` blocks until every call ended (or `poll` raises, which abandons the calls still running);
`fan_out_background` returns at once and hands each result to a callback as it comes; `on_hosts`
connects to each host first and closes the connection after. Results and errors are keyed by host name
(an inventory's names are unique). A call that raises something other than a HostError (a bug, an
unexpected library error) still names its host.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, TypeVar, Union

from ..errors import HostError, HostsFailed, UnexpectedError

T = TypeVar("T")
MAX_THREADS = 64
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
    pool = ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(items)), thread_name_prefix=thread_name)
    futures: Dict[Future, T] = {pool.submit(call, fn, i, name(i)): i for i in items}
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=POLL_S if poll else None, return_when=FIRST_COMPLETED)
            for fut in done:
                _keep(out, name(futures[fut]), fut.result())
            if poll is not None:
                poll()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return out


def fan_out_background(items: Sequence[T], fn: Callable[[T], object], *, name: Callable[[T], str],
                       on_each: Callable[[T, Union[object, HostError]], None], thread_name: str = "hosts") -> None:
    """fn on every item, each in a daemon thread of its own; on_each(item, result or HostError) as each ends."""
    for item in items:
        threading.Thread(target=lambda i=item: on_each(i, call(fn, i, name(i))), daemon=True,
                         name=f"{thread_name}-{name(item)}").start()


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

    threading.Thread(target=body, daemon=True, name=thread_name).start()
    return future


def _keep(out: GroupResult, name: str, value: object) -> None:
    if isinstance(value, HostError):
        out.errors[name] = value
    else:
        out.results[name] = value
