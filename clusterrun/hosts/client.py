"""The controller's side of the host program: install it on demand, then push, start, follow, stop.

Each method is one command on the host (one round trip plus the host's Python start-up); the host
program is installed once per host and version, on the first command that finds it missing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple, TypeVar

from ..config.inventory import Host, Timeouts
from ..errors import ConnectError, HostError, RemoteCommandError, StartError, UnsafeWorkdir
from .. import remote
from ..remote import BOOTSTRAP, EXIT_PROGRAM_MISSING, EXIT_UNSAFE_WORKDIR, INSTALLER, PROGRAM_ID, UNSAFE_WORKDIR
from ..transport import Stream, StreamClosed, Transport
from .bandwidth import BenchStream
from .failures import error_answer, failure
from .group import background
from .manifest import Manifest
from .relay import RelayGroup
from .push import HeldPush, PushChannel, push_result
from .wire import FollowStream, Prepended, ProgramMissing, Samples, exit_code_of, offer, read_msg

if TYPE_CHECKING:
    from .pull import PullStream

T = TypeVar("T")
with open(os.path.join(os.path.dirname(remote.__file__), "host", "env", "base.py"), encoding="utf-8") as _fh:
    BASE_SOURCE = _fh.read()  # run as `python -c`: its __main__ part describes the interpreter it is given


class HostClient:
    """One host, through one transport; `label` names it in every error."""

    def __init__(self, host: Host, transport: Transport, timeouts: Timeouts):
        self.host = host
        self.label = host.name
        self.transport = transport
        self.timeouts = timeouts
        self.route = ""  # over SSH: how the host was reached, each value with where it came from
        self._installed = False

    # -------------------------------------------------------------- plumbing

    def argv(self, command: str, *args: str) -> List[str]:
        # -S: the host program is stdlib only, and site's scan of site-packages (.pth files: a big
        # environment has many) is most of a Python start-up; the ranks start their own Python as usual
        return [self.host.python, "-S", "-c", BOOTSTRAP, self.host.workdir, PROGRAM_ID, command, *args]

    def install(self) -> None:
        done = self.transport.run([self.host.python, "-c", INSTALLER, self.host.workdir, PROGRAM_ID,
                                   remote.SOURCE_SHA256], stdin=remote.SOURCE, timeout=self.timeouts.command)
        if done.exit_code != 0:
            raise self._command_failed("cannot install clusterrun's host program", done.exit_code, done.stderr)
        self._installed = True

    def _command_failed(self, what: str, code: Optional[int], stderr: bytes) -> HostError:
        tail = stderr.decode("utf-8", "replace")
        if code == EXIT_UNSAFE_WORKDIR and UNSAFE_WORKDIR in tail:
            return self._unsafe_workdir(tail)
        if code == 127 or "not found" in tail[-300:] and code not in (0, 1):
            return RemoteCommandError(self.label, f"cannot run Python {self.host.python!r} on this host",
                                      exit_code=code, output_tail=tail,
                                      hint="install Python 3 there, or set python: in the inventory")
        return RemoteCommandError(self.label, what, exit_code=code, output_tail=tail)

    def _with_program(self, attempt: Callable[[], T]) -> T:
        """One host-program call: if the host lacks the program (in this version), install it and try once
        more. Every call to the host program goes through here."""
        try:
            return attempt()
        except ProgramMissing:
            self.install()
            return attempt()

    def _run(self, command: str, *args: str, stdin: Optional[bytes] = None, timeout: Optional[float] = None):
        done = self.transport.run(self.argv(command, *args), stdin=stdin, timeout=timeout or self.timeouts.command)
        if done.exit_code == EXIT_PROGRAM_MISSING:
            raise ProgramMissing()
        return done

    def call(self, command: str, *args: str, stdin: Optional[bytes] = None,
             timeout: Optional[float] = None) -> dict:
        """Run one host command that answers with a JSON line."""
        done = self._with_program(lambda: self._run(command, *args, stdin=stdin, timeout=timeout))
        reply = _last_json(done.stdout)
        if done.exit_code == 0 and isinstance(reply, dict):
            return reply
        if isinstance(reply, dict) and "error" in reply:
            raise error_answer(self.label, reply["error"], what=command, path=reply.get("path") or "",
                               exit_code=done.exit_code)
        raise self._command_failed(f"{command} failed", done.exit_code, done.stderr)

    def _unsafe_workdir(self, tail: str) -> HostError:
        line = next(ln for ln in tail.splitlines() if ln.startswith(UNSAFE_WORKDIR))
        _, rest = line.split(" ", 1)
        path, uid, mode = rest.rsplit(" ", 2)
        bits = int(mode, 8)
        why = f"mode {bits:o}: others may write to it" if bits & 0o022 else f"owned by uid {uid}, not the login user"
        return UnsafeWorkdir(self.label, f"{path} is {why}; clusterrun runs nothing from a folder another user "
                                         "could have put code in",
                             hint=f"if {path} is yours: chmod go-w {path}; else point workdir: (hosts[].workdir "
                                  "or defaults.workdir) at a folder only you can write, e.g. ~/.clusterrun")

    # -------------------------------------------------------------- commands

    def read_file(self, attempt_key: str, rel: str) -> bytes:
        """A file from the run's job folder on this host (raw bytes)."""
        done = self._with_program(lambda: self._run("cat", attempt_key, rel))
        if done.exit_code != 0:
            reply = _last_json(done.stdout)
            if not isinstance(reply, dict) or "error" not in reply:
                raise self._command_failed(f"cannot read {rel}", done.exit_code, done.stderr)
            raise error_answer(self.label, reply["error"], exit_code=done.exit_code)
        return done.stdout

    def pull(self, run_id: str, paths: Sequence[str]) -> "PullStream":
        """What the PATHs select in the run's folder on this host, listed (sizes, modes, SHA-256); the
        PullStream then fetches the files wanted (remote/host/observe/pull.py)."""
        from .pull import PullStream

        def attempt() -> PullStream:
            stream = self.transport.open(self.argv("pull", run_id))
            pull = PullStream(stream, self.label, self.timeouts.command)
            try:
                pull.request(paths, list_timeout=self.timeouts.command * 5)
            except ConnectError:
                missing = exit_code_of(stream) == EXIT_PROGRAM_MISSING
                stream.close()
                if missing:
                    raise ProgramMissing() from None
                raise
            except BaseException:
                stream.close()
                raise
            return pull

        return self._with_program(attempt)

    def describe_base(self, command: str, index: Optional[Tuple[str, int]] = None) -> dict:
        """job.environment's base interpreter on this host, described as the push's facts would (and
        whether the package index answers from there): for wheels: controller or auto, before the push."""
        argv = [self.host.python, "-c", BASE_SOURCE, command] + ([index[0], str(index[1])] if index else [])
        done = self.transport.run(argv, timeout=self.timeouts.command)
        found = _last_json(done.stdout)
        if done.exit_code != 0 or not isinstance(found, dict):
            raise self._command_failed("cannot describe job.environment's base interpreter", done.exit_code,
                                       done.stderr)
        return found

    def free_port(self) -> int:
        return int(self.call("free-port")["port"])

    def claims(self, folders: Sequence[str]) -> dict:
        """Every claim and queue entry in these claims folders, any user's (remote/host/share/claims.py)."""
        return self.call("claims", *folders)

    def gpu_check(self, request: dict, timeout: float) -> dict:
        """The GPU preflight's raw facts here (remote/host/share/gpu_health.py); the request on stdin: it
        carries the host's env:, which stays off command lines."""
        return self.call("gpu-check", stdin=json.dumps(request).encode(), timeout=timeout)

    def leftovers(self, request: dict) -> dict:
        """The processes that hold the GPU devices here, labelled; with "kill", an ended run's killed
        (remote/host/share/leftovers.py)."""
        return self.call("leftovers", stdin=json.dumps(request).encode())

    def runs(self) -> dict:
        """Every run folder on this host: status (running, finished, receiving, unstarted), bytes, log
        sizes; the cache's size and the free space (remote/host/disk/runs.py)."""
        return self.call("runs", timeout=self.timeouts.command * 4)

    def clean(self, request: dict) -> dict:
        """Remove the run folders named (each re-checked there), collect the cache; what was freed."""
        return self.call("clean", stdin=json.dumps(request).encode(), timeout=self.timeouts.command * 4 + 120)

    def status(self, attempt_key: str) -> dict:
        return self.call("status", attempt_key)

    def stacks(self, attempt_key: str, ranks: Sequence[int] = (), via: str = "auto") -> dict:
        """Every thread's stack of the attempt's ranks on this host (remote/host/observe/stacks.py): by
        py-spy where the host has it, else through the ranks' bootstrap (faulthandler)."""
        args = [a for r in ranks for a in ("--rank", str(r))] + ["--via", via]
        return self.call("stacks", attempt_key, *args, timeout=self.timeouts.command)

    def samples(self, target: str, interval: float, count: int = 0, claims_dir: str = "") -> "Samples":
        """This host's load and its ranks' (target: an attempt key, or "-" for the host alone, with
        claims_dir every user's claims there too), sampled on the host (remote/host/observe/samples.py): a
        JSON line every interval on one open channel."""
        argv = self.argv("samples", target, f"{interval:g}", str(count), *([claims_dir] if claims_dir else []))
        wait = interval + self.timeouts.command

        def attempt() -> "Samples":
            samples = Samples(self.transport.open(argv), self.label)
            try:
                samples.first = samples.next(wait)  # the first line tells whether the program is there
            except BaseException:
                samples.close()
                raise
            return samples

        return self._with_program(attempt)

    def stop(self, attempt_key: str, grace: float, reason: str = "stopped") -> dict:
        """Stop every rank of the attempt on this host (TERM, grace, KILL); a run's id stops every attempt of
        it. reason goes into their exit records."""
        return self.call("stop", attempt_key, f"{grace:g}", reason, timeout=grace + self.timeouts.command)

    def start(self, attempt_key: str, spec: dict) -> dict:
        """Hand the spec (env and secrets included) to the host on stdin; it lands in a 0600 file there."""
        gaps = float(spec.get("start_gap") or 0) * max(0, len(spec.get("ranks") or []) - 1)  # launch/start.py
        try:
            return self.call("start", attempt_key, stdin=json.dumps(spec).encode(),
                             timeout=self.timeouts.command + gaps if gaps else None)
        except RemoteCommandError as exc:
            raise StartError(self.label, str(exc.message), hint=exc.hint) from None

    def follow(self, attempt_key: str, offsets: Dict[Hashable, int], once: bool = False) -> FollowStream:
        """Frames from the host's `follow`; offsets by rank, or ("a", i) for auxiliary stream i."""
        wire = {f"a{k[1]}" if isinstance(k, tuple) else str(k): v for k, v in offsets.items()}
        args = [attempt_key, json.dumps(wire)] + (["--once"] if once else [])

        def attempt() -> FollowStream:
            stream = FollowStream(self.transport.open(self.argv("follow", *args)), self.label)
            if self._installed:
                return stream
            try:  # the first frame tells whether the program is there (ProgramMissing otherwise)
                return Prepended(stream, stream.next(self.timeouts.command))
            except ProgramMissing:
                stream.close()
                raise
            except TimeoutError:
                return stream

        return self._with_program(attempt)

    def bandwidth(self, conf: dict) -> BenchStream:
        """Start the host's `bandwidth` (remote/host/net/bandwidth.py: `check --net`) with its token and addr:;
        the stream, once the host listens (its ready answer: port, bound address, chosen interface)."""
        def attempt() -> BenchStream:
            stream = self.transport.open(self.argv("bandwidth"))
            try:
                ready = offer(stream, conf, self.timeouts.command)
            except BaseException:
                stream.close()
                raise
            if "error" in ready:
                stream.close()
                raise error_answer(self.label, ready["error"], what="bandwidth", exit_code=1)
            return BenchStream(self.label, stream, ready["ready"])

        return self._with_program(attempt)

    def push(self, attempt_key: str, manifest: Manifest, progress: Callable[[int], None] = lambda n: None,
             want_port: bool = False, check_port: Optional[int] = None, master_addr: str = "",
             relay: Optional[Tuple[RelayGroup, int]] = None, coordinator: bool = False,
             hold: bool = True, claim: Optional[Tuple[dict, Any, int]] = None,
             env_base: Optional[str] = None, fingerprint: bool = False) -> "HeldPush":
        """Push the job and keep the channel for the start: one command per host for push and start.
        Dropping the HeldPush (abandon) makes the host remove the run it received; hold=False ends the
        command after the push instead (the run folder stays, unstarted; a later `start` starts it). The
        host also reports facts for the preflight (its Python; whether check_port is free). relay: (the
        push's chain, this host's place in it): objects may come from another host (hosts/relay.py); a
        push that fails tells the chain, so the other hosts stop waiting for this one. coordinator: rank
        0's host binds the supervisors' meeting port now, so every host can be started at once. claim:
        (the request, the launch's ClaimGroup, this host's place in it): the host claims its share before
        any byte is sent, and every host's answer meets in the group (launch/claiming.py). env_base:
        job.environment's base interpreter, which the host describes in its facts (or says is missing).
        fingerprint: the facts carry the stack fingerprint of the host's python (a launch without
        job.environment compares them: HeldPush.fingerprint), which saves the launch a round trip."""
        try:
            result, stream, answer = self._with_program(lambda: self._push_once(
                attempt_key, manifest, progress, hold, want_port, check_port, master_addr, relay, coordinator,
                claim, env_base, fingerprint))
        except BaseException as exc:
            if relay is not None:
                relay[0].fail(relay[1])
            if claim is not None:
                claim[1].fail(claim[2], f"{self.label}: {exc}")
            raise
        held = HeldPush(self.label, self.timeouts, stream if hold else None, result, answer.get("port"),
                        answer.get("facts") or {},
                        answer.get("coordinator_port"), claim=answer.get("claim"))
        held.wait_port = answer.get("wait_port")
        return held

    def _push_once(self, attempt_key: str, manifest: Manifest, progress: Callable[[int], None], hold: bool,
                   want_port: bool, check_port: Optional[int], master_addr: str,
                   relay: Optional[Tuple[RelayGroup, int]] = None, coordinator: bool = False,
                   claim: Optional[Tuple[dict, Any, int]] = None, env_base: Optional[str] = None,
                   fingerprint: bool = False):
        t0 = time.monotonic()
        stream = self.transport.open(self.argv("receive", attempt_key))
        channel = PushChannel(stream, self.label, self.host, self.timeouts)
        timeout = self.timeouts.command
        keep = False
        try:
            answer = channel.offer({**manifest.wire(), "hold": hold, "free_port": want_port,
                                          "check_port": check_port, "master_addr": master_addr,
                                          "addr": self.host.master_addr, "relay": relay is not None,
                                          "coordinator": coordinator, "claim": claim[0] if claim else None,
                                          "env_base": env_base, "fingerprint": fingerprint})
            if claim is not None:
                answer = channel.claim(answer, claim[1], claim[2])
            channel.raise_error(answer)
            sent = channel.send_missing(manifest, answer, relay, progress)
            result = read_msg(stream, timeout)
            if "relay_failed" in result:  # its upstream failed it: what it still lacks comes from here
                sent += channel.send_objects(manifest, [(sha, None) for sha in result["need"]], progress)
                result = read_msg(stream, timeout)
            channel.raise_error(result)
            keep = hold
            return push_result(sent, answer, result, time.monotonic() - t0), stream, answer
        except (TimeoutError, StreamClosed) as exc:
            raise self._push_failure(stream, exc, timeout) from None
        finally:
            if not keep:
                stream.close()

    def _push_failure(self, stream: Stream, exc: BaseException, timeout: float) -> BaseException:
        """The host program failed (its exit code and stderr say how), or the host went silent, or the
        connection itself was lost."""
        code = exit_code_of(stream) if isinstance(exc, StreamClosed) else None
        if code not in (None, -1):
            return self._command_failed(f"push interrupted: {exc}", code, stream.stderr())
        return failure(exc, self.label, silent=f"push: no answer within {timeout:g} s",
                       lost="connection lost during the push", stream=stream)

    def close(self) -> None:
        self.transport.close()


def _last_json(stdout: bytes) -> object:
    """The JSON value on the last line of a command's output (None when there is none)."""
    try:
        return json.loads(stdout.decode().strip().splitlines()[-1]) if stdout.strip() else None
    except (ValueError, UnicodeDecodeError):
        return None


def make_connect(timeouts: Timeouts, ahead: Sequence[Host] = ()) -> Callable[[Host], HostClient]:
    """Host → connected HostClient; paramiko is imported only when some host needs SSH. ahead: hosts to
    start connecting to now, in the background (a launch: the handshakes go on while the rest of the
    controller loads); the first connect(host) of each takes that connection, or its error."""
    connector: list = []
    lock = threading.Lock()
    early: Dict[str, "Future[HostClient]"] = {}

    def connect(host: Host) -> HostClient:
        with lock:
            future = early.pop(host.name, None)
        return future.result() if future is not None else fresh(host)

    def fresh(host: Host) -> HostClient:
        if host.connection == "local":
            from ..transport.local import LocalTransport

            return HostClient(host, LocalTransport(host.name), timeouts)
        with lock:
            if not connector:
                from ..transport.openssh import config_options
                from ..transport.ssh import Connector

                connector.append((Connector(timeouts), config_options()))
        from ..config.ssh_config import ssh_target

        ssh, options = connector[0]
        try:
            target = ssh_target(host, options)
            client = HostClient(host, ssh.connect(target), timeouts)
            client.route = target.provenance()
            return client
        except HostError:
            raise
        except Exception as exc:  # whatever paramiko raises: still a connection problem of this host
            raise ConnectError(host.name, f"{type(exc).__name__}: {exc}") from None

    for host in ahead:
        early[host.name] = background(fresh, host, thread_name=f"connect-{host.name}")
    return connect
