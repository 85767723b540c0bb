"""The one fan-out: act on every host in parallel, collect `{host: result | error}`, report every failure
at once (fabric's `Group` → `GroupResult` / `GroupException`).

`fan_out` blocks until every call ended (or `poll` raises, which abandons the calls still running);
`fan_out_background` returns at once and hands each result to a callback as it comes. A call that
raises something other than a HostError (a bug, an unexpected library error) still names its host.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, Hashable, Optional, Sequence, TypeVar, Union

from ..errors import HostError, HostsFailed

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
MAX_THREADS = 64
POLL_S = 0.05


class UnexpectedError(HostError):
    reason = "unexpected error"


@dataclass
class GroupResult(Generic[K]):
    """Per-host results of one fan-out; `failed` and `raise_for` name hosts by their label."""

    results: Dict[K, object] = field(default_factory=dict)
    errors: Dict[K, HostError] = field(default_factory=dict)
    names: Dict[K, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def failed(self) -> Dict[str, HostError]:
        """Host name → error, in the order the hosts were given (not the order they failed in)."""
        return {name: self.errors[k] for k, name in self.names.items() if k in self.errors}

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


def fan_out(items: Sequence[T], fn: Callable[[T], object], *, key: Callable[[T], K], name: Callable[[T], str],
            poll: Optional[Callable[[], None]] = None, thread_name: str = "hosts") -> GroupResult[K]:
    """fn on every item in parallel; `poll` runs every 50 ms meanwhile and may raise to give up waiting."""
    out: GroupResult[K] = GroupResult(names={key(i): name(i) for i in items})
    if not items:
        return out
    pool = ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(items)), thread_name_prefix=thread_name)
    futures: Dict[Future, T] = {pool.submit(call, fn, i, name(i)): i for i in items}
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=POLL_S if poll else None, return_when=FIRST_COMPLETED)
            for fut in done:
                _keep(out, key(futures[fut]), fut.result())
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


def _keep(out: GroupResult, k: Hashable, value: object) -> None:
    if isinstance(value, HostError):
        out.errors[k] = value
    else:
        out.results[k] = value
