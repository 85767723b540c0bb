"""One push on one host, over the open channel of its `receive` command (remote/host/push/receive.py): the
manifest offered, the claim exchange, the missing objects sent (or left to the relay chain's plan), and
what the push leaves: its figures (`PushResult`) and, while the host waits on the same channel for the
word, a `HeldPush` (start, wait in line, job.environment, job.setup, or abandon). `HostClient.push` drives it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..config.inventory import Host, Timeouts
from ..errors import EnvBuildError, PushError, SetupError, StartError
from ..transport import Stream, StreamClosed
from .failures import exchange
from .manifest import Manifest, objects_to_send, read_chunks
from .relay import RelayGroup
from .wire import FollowStream, offer, pack_msg, read_msg

BATCH = 1 << 20


@dataclass(frozen=True)
class PushResult:
    sent_bytes: int
    objects: int
    files: int
    seconds: float
    repaired: int = 0  # cached objects found changed on the host (a job wrote to a pushed file): sent again
    relayed: int = 0  # object bytes that came from another host (relay push), not from the controller
    relay_notes: Tuple[str, ...] = ()  # what failed on the relay path (the rest then came directly)
    timing: Optional[dict] = None  # where the push's time went on the host (remote/host/push/receive.py)


class PushChannel:
    """The controller's side of one `receive` command, its messages in order."""

    def __init__(self, stream: Stream, label: str, host: Host, timeouts: Timeouts):
        self.stream = stream
        self.label = label
        self.host = host
        self.timeouts = timeouts

    def offer(self, message: dict) -> dict:
        """The push's manifest out, the host's answer (what it lacks) back."""
        return offer(self.stream, message, self.timeouts.command)

    def claim(self, answer: dict, group: Any, index: int) -> dict:
        """The claim exchange (remote/host/share/session.py), until the launch's verdict lets the push go
        on: the push's first answer, with the host's claim (or, --detach --wait, its place in line)."""
        timeout = self.timeouts.command
        round_no = 0
        while True:
            if "error" in answer:
                group.fail(index, f"{self.label}: {answer['error']}")
                return answer
            kind, info = claim_kind(answer)
            verdict = group.answer(index, round_no, kind, info)
            if verdict in ("go", "handoff"):
                self.stream.write(pack_msg({"confirm": True} if verdict == "go" else {"queue": True}), timeout)
                return answer
            if verdict == "requeue":  # it was free, another host was not: back in line
                self.stream.write(pack_msg({"requeue": True}), timeout)
                group.status(index, read_msg(self.stream, timeout)["queued"])
            while True:  # in line: ask how it stands until every host would say yes, then try again
                action, next_round = group.next_action(index)
                self.stream.write(pack_msg({action: True}), timeout)
                answer = read_msg(self.stream, timeout)
                if action == "try":
                    round_no = next_round
                    break
                group.status(index, answer["queued"])

    def raise_error(self, answer: dict) -> None:
        if "error" in answer:
            raise PushError(self.label, answer["error"], path=answer.get("path", ""),
                            hint=push_hint(answer.get("kind", "")))

    def send_missing(self, manifest: Manifest, answer: dict,
                      relay: Optional[Tuple[RelayGroup, int]], progress: Callable[[int], None]) -> int:
        """What the host lacks: all of it from here, or (relay push) what the chain's plan leaves to the
        controller; the bytes sent."""
        if relay is None:
            return self.send_objects(manifest, [(sha, None) for sha in answer["missing"]], progress)
        group, index = relay
        plan = group.arrive(index, self.host.name, answer["missing_objects"], self.host.master_addr,
                            answer.get("relay_port"))
        self.stream.write(pack_msg({"relay": plan}), self.timeouts.command)
        if plan["from"] != "controller":
            return 0
        return self.send_objects(manifest, [(o[0], o[2]) for o in plan["objects"]], progress)

    def send_objects(self, manifest: Manifest, wanted: Sequence[Tuple[str, Optional[bool]]],
                      progress: Callable[[int], None]) -> int:
        """The objects' bytes back to back, in order (small files batched: one write, few packets, per MiB)."""
        timeout = self.timeouts.command
        sent = 0
        batch = bytearray()
        try:
            for entry in objects_to_send(manifest, wanted):
                for chunk in read_chunks(entry.source, entry.size):
                    if not batch and len(chunk) >= BATCH:  # a big file's chunk goes as it is
                        self.stream.write(chunk, timeout)
                        sent += len(chunk)
                        progress(len(chunk))
                        continue
                    batch += chunk
                    if len(batch) >= BATCH:
                        self.stream.write(batch, timeout)
                        sent += len(batch)
                        progress(len(batch))
                        batch = bytearray()
            if batch:
                self.stream.write(batch, timeout)
                sent += len(batch)
                progress(len(batch))
        except StreamClosed:
            pass  # the host stopped reading: its answer says why
        return sent


def claim_kind(answer: dict) -> Tuple[str, dict]:
    """What a host's claim answer is: busy, queued (in line), or granted (the first answer, claim taken)."""
    if "busy" in answer:
        return "busy", answer["busy"]
    if "queued" in answer:
        return "queued", answer["queued"]
    claim = answer.get("claim") or {}
    if "queued" in claim:  # --detach --wait: the push goes on while it waits in line
        return "queued", claim["queued"]
    return "granted", claim


def push_result(sent: int, answer: dict, result: dict, seconds: float) -> PushResult:
    """The push's figures, from the host's first answer (what it repaired) and its last (what it holds)."""
    return PushResult(sent_bytes=sent, objects=result["objects"], files=result["files"], seconds=seconds,
                      repaired=len(answer.get("repaired") or ()), relayed=result.get("relayed") or 0,
                      relay_notes=tuple(result.get("relay_notes") or ()),
                      timing=result.get("timing") if isinstance(result.get("timing"), dict) else None)


def push_hint(kind: str) -> str:
    return {"disk_full": "free space in the host's workdir (or point workdir: at a bigger disk); "
                         "nothing was started and partial files were removed",
            "exists": "a run with this id already exists on the host; launch again"}.get(kind, "")


@dataclass(frozen=True)
class SetupResult:
    skipped: bool  # the same setup (commands and pushed files) already succeeded on this host
    seconds: float
    ran_at: Optional[float] = None  # when the skipped setup ran
    run_id: Optional[str] = None  # in which run


@dataclass(frozen=True)
class EnvResult:
    """job.environment on one host (remote/host/env/build.py's answer)."""

    python: str  # the venv's interpreter: the ranks, torchrun, setup and notify run with it
    key: str
    built: bool  # False: the venv was there (a relaunch runs no installer)
    waited: bool  # another launch was building it; this one waited and used it
    seconds: float
    installer: Optional[str]  # "uv" or "pip": the one that built it
    fingerprint: Dict[str, Any]


class HeldPush:
    """A host that has the job and waits, on the same channel, for the word to start it."""

    def __init__(self, label: str, timeouts: Timeouts, stream: Stream, result: PushResult, port: Optional[int],
                 facts: dict, coordinator_port: Optional[int] = None, claim: Optional[dict] = None):
        self.label, self.timeouts = label, timeouts  # the host's, as its HostClient has them
        self.result = result
        self.claim = claim  # what the host took ({"granted": GPUs, ...}), or its place in line ({"queued"})
        self.wait_port: Optional[int] = None  # --detach --wait, rank 0's host: where the other waiters join
        self.port = port  # a free port on the host, when asked for
        self.coordinator_port = coordinator_port  # rank 0's host: where the other supervisors join it
        self.facts = facts  # for the preflight: {"python", "executable", "net"[, "port"]} (remote/host/push/facts.py)
        self._stream: Optional[Stream] = stream

    def start(self, spec: dict) -> dict:
        """Start the run (spec with env and secrets goes to a 0600 file); the supervisor's state."""
        return self._start(spec, follow=False)[0]

    def start_following(self, spec: dict) -> Tuple[dict, FollowStream]:
        """Start the run, then follow it on this same channel (remote/host/push/held.py): the state, and
        the run's follow frames from its first byte; no second command, round trip or interpreter on the
        host for an attached launch."""
        return self._start(spec, follow=True)

    def _start(self, spec: dict, follow: bool) -> Tuple[dict, Optional[FollowStream]]:
        stream, self._stream = self._stream, None
        # ranks started one after another (job.start order rank) answer after their gaps
        gaps = float(spec.get("start_gap") or 0) * max(0, len(spec.get("ranks") or []) - 1)
        label, timeout = self.label, self.timeouts.command + gaps
        keep = False
        try:
            with exchange(label, silent=f"start: no answer within {timeout:g} s",
                          lost="connection lost while starting"):
                stream.write(pack_msg({"start": spec, "follow": {}} if follow else {"start": spec}), timeout)
                answer = read_msg(stream, timeout)
            keep = follow and "error" not in answer
        finally:
            if not keep:
                stream.close()
        if "error" in answer:
            raise StartError(label, answer["error"])
        return answer["state"], FollowStream(stream, label) if keep else None

    def wait(self, spec: dict, mesh: dict) -> dict:
        """--detach --wait: hand the job to a detached waiter on the host, which starts it with this spec when
        its turn comes (remote/host/share/waiter.py; mesh: how the hosts' waiters meet)."""
        stream, self._stream = self._stream, None
        label, timeout = self.label, self.timeouts.command
        try:
            with exchange(label, silent=f"wait: no answer within {timeout:g} s",
                          lost="connection lost while handing the job to its waiter", stream=stream):
                stream.write(pack_msg({"wait": {"spec": spec, "mesh": mesh}}), timeout)
                answer = read_msg(stream, timeout)
        finally:
            stream.close()
        if "error" in answer:
            raise StartError(label, answer["error"])
        return answer["waiting"]

    def setup(self, request: dict, on_output: Callable[[str], None], silence_s: float) -> SetupResult:
        """Run job.setup on the host (remote/host/push/job_setup.py), its output to on_output as it comes; a failing
        command raises RemoteCommandError naming it and the last lines. silence_s: how long the host may
        say nothing at all (it beats every 2 s) before it counts as lost."""
        label = self.label
        stream = self._stream
        if stream is None:
            raise StartError(label, "the push's channel is gone")
        tail: List[str] = []
        with exchange(label, silent=f"setup: no word from the host for {silence_s:g} s",
                      lost="connection lost during the setup"):
            stream.write(pack_msg({"setup": request}), self.timeouts.command)
            while True:
                message = read_msg(stream, silence_s)
                if "out" in message:
                    on_output(message["out"])
                    tail = (tail + message["out"].splitlines())[-40:]
                elif "setup" in message:
                    break
        done = message["setup"]
        if done.get("exit") != 0:
            index = done.get("command")
            command = request["commands"][index] if isinstance(index, int) else ""
            late = " (timed out: timeouts.setup)" if done.get("exit") == 124 else ""
            raise SetupError(label, f"job.setup[{index}]{late}: {command}", command=command,
                             exit_code=done.get("exit"), output_tail="\n".join(tail),
                             hint="nothing was started; fix the command (or the host) and launch again")
        return SetupResult(skipped=bool(done.get("skipped")), seconds=float(done.get("seconds") or 0.0),
                           ran_at=done.get("ran_at"), run_id=done.get("run_id"))

    def environment(self, request: dict, on_event: Callable[[dict], None], silence_s: float) -> EnvResult:
        """Use or build job.environment's venv on the host (remote/host/env/build.py); its progress to
        on_event as it comes; a failed build raises EnvBuildError with the installer's last lines."""
        answer = self._exchange("environment", request, on_event, silence_s)
        if "error" in answer:
            hint = {"disk_full": "free space in the host's workdir (or point workdir: at a bigger disk)",
                    "timeout": "raise timeouts.setup, or build with wheels: controller"}.get(
                answer.get("kind"), "fix the requirements file (or the host) and launch again; nothing was started")
            raise EnvBuildError(self.label, answer["error"], output_tail="\n".join(answer.get("tail") or []),
                                hint=hint)
        return EnvResult(python=answer["python"], key=answer["key"], built=bool(answer.get("built")),
                         waited=bool(answer.get("waited")), seconds=float(answer.get("seconds") or 0.0),
                         installer=answer.get("installer"), fingerprint=dict(answer.get("fingerprint") or {}))

    def fingerprint(self) -> Dict[str, Any]:
        """The host's stack fingerprint for its plain python (remote/host/env/fingerprint.py, cached there),
        from the push's facts: asked for with the manifest (HostClient.push(fingerprint=True))."""
        if not isinstance(self.facts.get("fingerprint"), dict):
            raise StartError(self.label, "the push's answer has no stack fingerprint (the launch did not ask for it)")
        return dict(self.facts["fingerprint"])

    def _exchange(self, kind: str, request: dict, on_event: Callable[[dict], None], silence_s: float) -> dict:
        """One step of the held session that may take a while: the host beats or reports until it answers."""
        stream = self._stream
        if stream is None:
            raise StartError(self.label, "the push's channel is gone")
        with exchange(self.label, silent=f"{kind}: no word from the host for {silence_s:g} s",
                      lost=f"connection lost during the {kind} step"):
            stream.write(pack_msg({kind: request}), self.timeouts.command)
            while True:
                message = read_msg(stream, silence_s)
                if kind in message:
                    return message[kind]
                if "env" in message:
                    on_event(message["env"])

    def abandon(self) -> None:
        """Do not start: the host removes what it received."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
