"""One exception tree for clusterrun; the CLI maps each class to a documented exit code.

Exit codes (README "Exit codes"): 0 success · 1 job failed, a rank was lost, or the job could not be
pushed or started · 2 usage or inventory error · 3 connection, auth or host-key failure · 4 time limit ·
5 hosts busy (another run holds the slots or GPUs; nothing was pushed or started) · 6 a GPU failed the
GPU preflight and `gpus:` leaves no other (nothing was started; docs/gpus.md) · 130 interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONNECT = 3
EXIT_TIME_LIMIT = 4
EXIT_BUSY = 5
EXIT_GPU = 6
EXIT_INTERRUPTED = 130


class ClusterrunError(Exception):
    """Base of every error clusterrun raises on purpose."""

    exit_code = EXIT_FAILED


class UsageError(ClusterrunError):
    """Bad command line, bad inventory, unknown run id: the user can fix it without touching a host."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Problem:
    """One inventory problem, located in the source file."""

    file: str
    line: int  # 1-based
    column: int  # 1-based
    key: str  # key path such as hosts[1].port, or "" for the document
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class InventoryError(UsageError):
    """The inventory is invalid; carries every problem found, each with file:line:col and key path."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = tuple(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        head = "invalid inventory" if len(self.problems) == 1 else f"invalid inventory ({len(self.problems)} problems)"
        return head + ":\n" + "\n".join(f"  {p}" for p in self.problems)


class HostError(ClusterrunError):
    """Something went wrong on or with one host."""

    reason = "error"

    def __init__(self, host: str, message: str, *, hint: str = ""):
        self.host = host
        self.message = message
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.host}: {self.reason}: {self.message}" + self.details()
        return f"{text}\n    hint: {self.hint}" if self.hint else text

    def details(self) -> str:
        """What a subclass adds between the message and the hint."""
        return ""


class ConnectError(HostError):
    exit_code = EXIT_CONNECT
    reason = "unreachable"


class Dropped(ConnectError):
    """The host closed the connection before it said a word of SSH: sshd turning away a connection past
    its MaxStartups (too many unauthenticated at once), what a bastion in front of many hosts does first.
    transport/ssh.py tries again (transport/pacing.py lowers the pace); past timeouts.connect it is the
    host's error."""


class NothingListens(ConnectError):
    """A tunnel to localhost:PORT on a host that answers, where nothing listens on that port (yet): the
    host is reachable, the program that will serve the port (TensorBoard, a notebook) has not opened it."""

    reason = "nothing listens"

    def __init__(self, host: str, port: int, why: str = ""):
        self.port = port
        self.why = why
        super().__init__(host, f"localhost:{port}",
                         hint="the forward stays open: the next connection gets through once something "
                              "listens there")

    def __str__(self) -> str:
        text = f"nothing listens on localhost:{self.port} on {self.host} yet" + (f" ({self.why})" if self.why else "")
        return f"{text}\n    hint: {self.hint}"


class AuthError(ConnectError):
    reason = "authentication failed"


class HostKeyUnknown(ConnectError):
    reason = "unknown host key"

    def __init__(self, host: str, message: str, *, fingerprint: str, hint: str):
        self.fingerprint = fingerprint
        super().__init__(host, message, hint=hint)


class HostKeyChanged(ConnectError):
    reason = "HOST KEY CHANGED"

    def __init__(self, host: str, message: str, *, fingerprint: str, hint: str):
        self.fingerprint = fingerprint
        super().__init__(host, message, hint=hint)


class RemoteCommandError(HostError):
    """A command on a host ended badly (invoke's UnexpectedExit: command, exit code, output tail).

    `command_exit` is the remote command's exit status; `exit_code` stays clusterrun's own (1)."""

    reason = "command failed"

    def __init__(self, host: str, message: str, *, command: str = "", exit_code: Optional[int] = None,
                 output_tail: str = "", hint: str = ""):
        self.command = command
        self.command_exit = exit_code
        self.output_tail = output_tail
        super().__init__(host, message, hint=hint)

    def details(self) -> str:
        text = f" (exit {self.command_exit})" if self.command_exit is not None else ""
        if self.output_tail:
            text += "\n" + "\n".join("    | " + line for line in self.output_tail.rstrip().splitlines()[-8:])
        return text


class SetupError(RemoteCommandError):
    """A job.setup command failed on a host (nothing was started)."""

    reason = "setup failed"


class EnvBuildError(RemoteCommandError):
    """job.environment's venv could not be built on a host (the installer's own words in the tail); the
    build folder was removed and nothing was started."""

    reason = "environment build failed"


class WheelsError(ClusterrunError):
    """job.environment.wheels: controller could not download the wheels for a host's platform here (which
    package, which platform); nothing was pushed."""

    def __init__(self, message: str, hint: str = ""):
        self.message, self.hint = message, hint
        super().__init__(message + (f"\n    hint: {hint}" if hint else ""))


class StackMismatch(UsageError):
    """The hosts' stack fingerprints differ (Python, torch, CUDA, NCCL, cuDNN, driver) in a field that
    job.environment.allow_mismatch does not accept: refused before any rank starts."""

    def __init__(self, rows: Sequence[str], table: str, fix: str):
        self.rows, self.table, self.fix = tuple(rows), table, fix
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(["the hosts' stacks differ; nothing was started:"] + [f"  {r}" for r in self.rows]
                         + [self.table, f"  fix: {self.fix}"])


class CommandTimeout(RemoteCommandError):
    exit_code = EXIT_CONNECT
    reason = "no answer"


class UnexpectedError(HostError):
    """A call on one host raised something that is not a HostError (a bug, an unexpected library error):
    the fan-out (hosts/group.py) still names the host, and the other hosts go on."""

    reason = "unexpected error"


class OutsideRun(HostError):
    """A PATH of `pull` the host refused: it leads out of the run's folder (absolute elsewhere, a symlink out)."""

    exit_code = EXIT_USAGE
    reason = "refused"


class PullStopped(HostError):
    """A pull was interrupted here (Ctrl-C): what arrived stays as .part files, for the next pull."""

    exit_code = EXIT_INTERRUPTED
    reason = "interrupted"


class PullTooLarge(HostError):
    """A pull whose listing would not fit on this machine's disk, or lists a file larger than one pulled
    file may be, or whose host sent more than it listed (runs/pull_limits.py): nothing more is fetched."""

    reason = "pull refused"


class PushError(HostError):
    reason = "push failed"

    def __init__(self, host: str, message: str, *, path: str = "", hint: str = ""):
        self.path = path
        super().__init__(host, f"{message}" + (f" ({path})" if path else ""), hint=hint)


class StartError(HostError):
    reason = "start failed"


class UnsafeWorkdir(HostError):
    """The host's workdir (or the host program in it) is not the login user's own, or others may write to
    it: clusterrun will not run code from there (someone else could have planted it)."""

    reason = "unsafe workdir"


class PreflightError(HostError):
    """A host is unfit to start the job (launch's preflight): no Python, a full disk, the master port taken."""

    reason = "preflight failed"


class GpuCheckFailed(HostError):
    """A GPU the run would use failed the GPU preflight (check/gpu_rules.py), or it could not be checked
    (fail closed), and the host's `gpus:` leaves no healthy one in its place: nothing was started."""

    exit_code = EXIT_GPU
    reason = "GPU preflight failed"


class HostsFailed(ClusterrunError):
    """Fan out, then report: every host that failed in one phase (fabric's GroupException)."""

    def __init__(self, phase: str, failures: Mapping[str, HostError]):
        self.phase = phase
        self.failures = dict(failures)
        super().__init__(str(self))

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        codes = {e.exit_code for e in self.failures.values()}
        return codes.pop() if codes in ({EXIT_CONNECT}, {EXIT_GPU}) else EXIT_FAILED

    def __str__(self) -> str:
        n = len(self.failures)
        hosts = f"{n} host{'s' if n != 1 else ''}"
        before_start = self.phase not in ("start", "stop")  # nothing runs yet: say so
        lines = [f"{self.phase} failed on {hosts}" + ("; nothing was started:" if before_start else ":")]
        for err in self.failures.values():
            lines.extend("  " + line for line in str(err).splitlines())
        return "\n".join(lines)


class HostBusy(HostError):
    """Another run holds (or waits ahead for) what this launch wants on the host (share/claims.py):
    `holders` and `ahead` are the entries in the way, as the host reported them (hosts/claims.Holder)."""

    exit_code = EXIT_BUSY
    reason = "busy"

    def __init__(self, host: str, message: str, *, holders: Sequence = (), ahead: Sequence = (), hint: str = ""):
        self.holders = tuple(holders)
        self.ahead = tuple(ahead)
        super().__init__(host, message, hint=hint)


class ClaimDropped(HostError):
    """This host was free, but another host of the launch was not: its claim was given back."""

    exit_code = EXIT_BUSY
    reason = "not claimed"


class HostsBusy(HostsFailed):
    """The launch's hosts are not all free (exit 5): nothing was pushed or started anywhere. `failures`
    holds the busy hosts only."""

    def __init__(self, failures: Mapping[str, HostError], *, waited: Optional[float] = None):
        self.waited = waited
        super().__init__("claim", {n: e for n, e in failures.items() if isinstance(e, HostBusy)} or failures)

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return EXIT_BUSY

    def __str__(self) -> str:
        n = len(self.failures)
        head = f"still busy after waiting {self.waited:.0f} s" if self.waited is not None else "hosts busy"
        lines = [f"{head}: {n} host{'s' if n != 1 else ''} held by other runs; nothing was pushed or started:"]
        for err in self.failures.values():
            lines.extend("  " + line for line in str(err).splitlines())
        if self.waited is None:
            lines.append("  (`clusterrun launch --wait` queues behind them; `clusterrun ps --hosts INVENTORY` "
                         "lists every claim)")
        return "\n".join(lines)


class StateError(UsageError):
    """The registry cannot be used as it is (written by a newer clusterrun, say)."""


class NotYourRun(UsageError):
    """`stop` of a run someone else launched: refused, naming them."""


class RunNotFound(UsageError):
    pass


class RunEnded(UsageError):
    """A command that reads a live run (`stacks`) on one that has ended: nothing to read (exit 2)."""


class FdLimitTooLow(UsageError):
    """The hosts need more open files than this process's hard limit allows (hosts/fds.py): exit 2,
    before any host is touched."""

    def __init__(self, hosts: int, ranks: int, needed: int, hard: int, what: str = ""):
        self.hosts, self.ranks, self.needed, self.hard, self.what = hosts, ranks, needed, hard, what
        super().__init__(str(self))

    def __str__(self) -> str:
        of = f"{self.what}: " if self.what else ""
        return (f"{of}{self.hosts} hosts ({self.ranks} ranks) need about {self.needed} open files at once, and this "
                f"process may open at most {self.hard} (the hard limit, `ulimit -Hn`): raise it to {self.needed} or "
                f"more (`nofile` in /etc/security/limits.conf, or LimitNOFILE= for a service), or use fewer hosts")


class SecretMissing(UsageError):
    pass
