"""The receiving end's claim (push/receive.py): checked and taken before a byte of the job arrives,
queued while the launch waits its turn, confirmed once every host of the launch has said yes, handed to
the supervisor at the start. Rules and file format: claims.py.

Protocol, inside the push's framed messages (the manifest carries the request as "claim"):
  host       → (claim taken, tentatively)  the push's first answer, with "claim": {"granted": [GPUs],
                                            "host_gpus", "capacity"}
               (busy, no --wait)            {"busy": VERDICT}, and the command ends: nothing was made
               (busy, --wait)               {"queued": STATUS}   (a queue entry is written first)
  controller → {"probe": true}   host → {"queued": STATUS}      how it stands now; nothing taken
               {"try": true}     host → the first answer (taken) or {"queued": STATUS}
  after the first answer:
  controller → {"confirm": true}  every host of the launch said yes: the claim is held; the push goes on
               {"requeue": true}  another host did not: the claim is dropped, the queue entry made;
                                  host → {"queued": STATUS}, and on as above
               {"queue": true}    (--detach --wait) the same, but the push goes on: the job waits here
                                  for its turn with nobody at the controller (share/waiter.py)
  end of input anywhere: the claim and the queue entry are removed.
STATUS: {"ready": whether this host would say yes now, "position" (1 = first in line), "holders" and
"ahead" (entries in the way, claims.brief), "why", "sums" (what the run needs, what the host offers and
what others hold: claims.judge)}. VERDICT: the same, from claims.judge.
A young launch's tentative claim in the way is waited out for up to the request's "contend" seconds
(it is deciding; see claims.py) before the host counts as busy.

A launch that goes away stops holding anyone up: at the end of its input (its controller ended, or was
killed) the host removes its entries at once; a controller that vanished without closing its connection
(a laptop's lid closed, its network gone) sends no probe: after the request's "silence" seconds without
a word, in line or holding a tentative claim, the host gives up the same way.
"""

import os
import select
import struct
import time

from ..stdlib import json
from ..wire import Fail, note, read_exact
from . import gpus as gpu_query
from .claims import Claims, describe, hand_over

RETRY_S = 0.05


class ClaimSession:
    def __init__(self, conf, stdin, send):
        self.conf = conf
        self.stdin = stdin
        self.send = send
        host_gpus = []
        if conf.get("gpus") is not None:
            host_gpus, problem = gpu_query.query()
            if conf["gpus"] == "auto" and not host_gpus:
                raise Fail("gpus: auto, but %s" % problem, "gpus")
        self.claims = Claims(conf, host_gpus)
        self.requeued = False  # the launch asked for another round: wait for its word before taking again
        self.waiting = False  # --detach --wait: the push goes on without a claim (waiter.py waits after it)
        self.handed = False  # the supervisor owns the claim now

    @property
    def gpus(self):
        return self.claims.gpus

    def acquire(self):
        """True once the claim is taken (tentatively), or with --detach --wait once queued; False when the
        host is busy and the launch does not wait (the busy answer was sent)."""
        deadline = time.time() + float(self.conf.get("contend") or 0)
        said = False
        while True:
            if self.requeued:
                self.requeued = False
                verdict = None
            else:
                verdict = self.claims.admit(queue=bool(self.conf.get("wait")))
                if "error" in verdict:
                    raise Fail(verdict["error"], "gpus")
                if "granted" in verdict:
                    return True
                if verdict.get("retry") and time.time() < deadline:
                    if not said:  # the controller quotes it should the answer be late
                        said = True
                        note("waiting up to %gs for a younger launch's tentative claim here: %s"
                             % (deadline - time.time(), describe(verdict)))
                    time.sleep(RETRY_S)
                    continue
                if not self.conf.get("wait"):
                    self.send({"busy": status(verdict)})
                    return False
            self.claims.enqueue()
            if self.conf.get("detach"):
                self.waiting = True
                return True
            self.send({"queued": self.status(verdict)})
            self._await_try()

    def _await_try(self):
        """Answer probes until the controller says try (Fail("aborted") at the end of input or after the
        launch's silence)."""
        while True:
            message = self.next_message()
            if message.get("try"):
                return
            self.send({"queued": self.status()})

    def next_message(self):
        """The controller's next message, within the request's silence. Read from the raw descriptor: the
        controller sends one message at a time here and waits for the answer, so nothing of it can sit in
        stdin's buffer (it is empty whenever a message is due)."""
        silence = float(self.conf.get("silence") or 0) or None
        fd = self.stdin.fileno()
        head = _read_exact(fd, 4, silence)
        (n,) = struct.unpack(">I", head)
        return json.loads(_read_exact(fd, n, silence).decode())

    def status(self, verdict=None):
        return status(verdict or self.claims.admit(take=False))

    def answer(self):
        """What the push's first answer says of the claim."""
        if self.waiting:
            return {"queued": self.status()}
        return {"granted": self.gpus, "host_gpus": self.claims.host_gpus, "capacity": self.claims.capacity}

    def decide(self, message=None):
        """The controller's word after the first answer (read here when not given): True to go on with the
        push, False for another round (requeue)."""
        if message is None:
            message = self.next_message()
        if message.get("confirm") and not self.waiting:
            self.claims.set_claim("held")
            self.claims.dequeue()
            return True
        if message.get("requeue") or message.get("queue"):
            self.claims.requeue()
            if message.get("queue"):
                self.waiting = True
                return True
            self.requeued = True
            return False
        raise Fail("expected the launch's word on the claim, got %s" % sorted(message), "protocol")

    def spec_claim(self, given):
        """The start spec's "claim" for the supervisor to adopt: the request with what was taken here."""
        return hand_over(dict(self.conf, **(given or {})), self.gpus)

    def close(self):
        """The push ends without a start here: nothing of this run stays in the claims folder."""
        if not self.handed:
            self.claims.release()


def _read_exact(fd, n, timeout):
    """n bytes of the raw descriptor, each read within timeout seconds of silence."""
    def read(k):
        if not select.select([fd], [], [], timeout)[0]:
            raise Fail("the launch said nothing for %g s: gone (its controller's machine asleep or cut off)"
                       % timeout, "aborted")
        return os.read(fd, min(k, 1 << 16))

    return read_exact(read, n, lambda: Fail("the controller went away", "aborted"))


def status(verdict):
    ready = "granted" in verdict
    return {"ready": ready, "position": verdict.get("position", 1), "holders": verdict.get("holders") or [],
            "ahead": verdict.get("ahead") or [], "why": "" if ready else describe(verdict),
            "sums": verdict.get("sums") or {}}
