"""What a run reports as it goes, for the UI (how it ended is outcome.py's)."""

from __future__ import annotations

from dataclasses import dataclass


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 host`, `2 hosts` (plural: the noun's own plural where it is not noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


@dataclass(frozen=True)
class Phase:
    name: str  # connect | push | start | run | stop
    detail: str = ""


@dataclass(frozen=True)
class Starting:
    """job.start order rank: this host starts now (step of steps), `after_s` after the one before started."""

    host: str
    ranks: str  # `r2-r3`
    step: int
    steps: int
    after_s: float = 0.0

    def describe(self) -> str:
        when = f", {self.after_s:g} s after the host before it started its ranks" if self.step > 1 else ""
        return f"start: {self.host} ({self.ranks}), host {self.step} of {self.steps} in rank order{when}"


@dataclass(frozen=True)
class HostProgress:
    phase: str
    host: str
    done: int = 0
    total: int = 0


@dataclass(frozen=True)
class HostDone:
    phase: str
    host: str
    seconds: float
    sent: int = 0  # a push: bytes the controller sent, of total; relayed: bytes from the host before it
    total: int = 0
    relayed: int = 0
    files: int = 0


@dataclass(frozen=True)
class LogLines:
    """Whole lines (bytes, each ending in a newline) of one rank, in order; or, with `stream` set, of one
    of a host's other outputs (its setup, torchrun's own messages), shown as `[host stream]`."""

    host: str
    node_rank: int
    rank: int
    data: bytes
    stream: str = ""


@dataclass(frozen=True)
class Tick:
    """The run's loop went round (every 50 ms at most while the ranks run): the renderer's moment to show
    lines it holds back to fold (ui.fold)."""


TICK = Tick()


@dataclass(frozen=True)
class RankSeen:
    """Under torchrun: a host's workers got their global ranks from the rendezvous; this rank is there."""

    node_rank: int
    rank: int


@dataclass(frozen=True)
class HostRestarts:
    """torchrun restarted a host's workers (job.restarts): how many times so far."""

    node_rank: int
    host: str
    restarts: int


@dataclass(frozen=True)
class RankEnded:
    host: str
    rank: int
    description: str
    failed: bool


@dataclass(frozen=True)
class Waiting:
    """launch --wait: where the launch stands in line on its hosts (hosts.claims.WaitStatus), whenever
    that changes."""

    status: object


@dataclass(frozen=True)
class Forwarded:
    """job.ports: 127.0.0.1:local here reaches localhost:remote on the host (the terminal names its URL)."""

    remote: int
    local: int
    host: str


@dataclass(frozen=True)
class Notice:
    text: str
    level: str = "info"  # info | warning | error


@dataclass(frozen=True)
class Stuck:
    """A rank (or, with rank None, torchrun itself) has been connecting to `remote` without an answer."""

    node_rank: int
    host: str
    rank: object  # int, or None for torchrun
    remote: str
    seconds: float

    @property
    def key(self) -> tuple:
        """What makes the warning the same one: said once per launch (or `logs`)."""
        return (self.node_rank, self.rank, self.remote)

    def describe(self, inventory: str) -> str:
        """The rendezvous watchdog's warning: who cannot reach what, and what to run (the run goes on)."""
        who = f"{self.host} r{self.rank}" if self.rank is not None else f"{self.host} torchrun"
        address = self.remote.rsplit(":", 1)[0]
        return (f"{who}: connecting to {self.remote} for {self.seconds:.0f} s without an answer (a firewall "
                f"dropping packets between {self.host} and {address}?); `clusterrun check {inventory}` tests "
                "that path. The run goes on: the network may heal")


@dataclass(frozen=True)
class Rendezvous:
    """A host's rendezvous watchdog named a rendezvous nobody can join (remote/host/run/rendezvous.py: its
    kinds `elsewhere`, `nothing`, `localhost`, `init_method`); text: the host's own words, with the fix."""

    node_rank: int
    host: str
    kind: str
    rank: object  # int, or None (rank 0's host: nothing listens)
    text: str
    seconds: float  # since the rank started
    held: float = 0.0  # since what it names began (the listener opened, the tries began)

    @property
    def key(self) -> tuple:
        return (self.node_rank, self.kind, self.rank)

    def describe(self, inventory: str) -> str:
        when = f"named {self.held:.0f} s after it began, " if self.kind in ("elsewhere", "localhost") else ""
        return f"rendezvous: {self.text} ({when}{self.seconds:.0f} s after the rank started; the run goes on)"
