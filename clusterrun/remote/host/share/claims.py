"""Claims: a run says which slots and GPUs it uses on this host, in a folder every user of the host sees,
so that a launch finds a busy host before it pushes anything, and waiting launches take turns. No daemon,
no root: files, a lock, and the owners' process ids.

The folder (`claims: {dir: ...}` in the inventory, default DEFAULT_DIR) is made like /tmp itself: sticky
and world-writable (1777), so everyone can add entries and only an entry's owner (or root) can remove
it. An existing one must be sticky or not writable by others (else anyone could remove anyone's claims).
In it, one file per entry, owned by its user, mode 0644 (everyone reads):

  UID-RUN-NODE.claim   run RUN (node NODE of it) holds slots and GPUs here
  UID-RUN-NODE.queue   run RUN waits for them (`launch --wait`)
  (the folder itself, and .lock in it, are flock'ed around every check-and-take: two launches cannot
  both win; how the files are opened and locked so that other users cannot stall or fool it: folder.py)

Entry (JSON): {"version": 1, "kind": "claim"|"queue", "run", "node", "by" (the controller's user@machine),
  "pid", "ticks" (its owner process and that process's start time, procs.start_ticks), "slots",
  "gpus" (indices; a queue entry: the ones it named, or "any"), "gpu_count", "since" (this host's clock),
  "ticket" [TIME, RUN] (the launch's place in line: the controller's clock when the launch began, its
  run id breaking ties), "state", "keep_until" (optional)}
  claim states: "tentative" (taken while the launch hears from its other hosts), "held" (it has every
  host: pushing), "running" (the supervisor owns it), "kept" (between a failed attempt and the next);
  queue state: "waiting".
The user is the file's owner (its uid, named by this host's passwd), never what the file says; a file
whose name's uid is not its owner's is ignored.

Live or stale: an entry is live while its owner process is (pid and start ticks match, and the process
runs as the entry file's owner; /proc shows them for every user's processes), a claim also until its
keep_until (folder.live). A stale entry is ignored, and removed when this user may (its own). Where /proc
hides other users' processes (hidepid), theirs count as live.

What the queue trusts: a live entry's ticket (the controller's clock; a user whose launch says it began
earlier stands earlier) and its slot count up to the host's capacity. It trusts nothing else an entry says
of its owner: the user is the file's, the process must be that user's.

Owners: the push's receiving process takes the claim (push/receive.py, share/session.py); the
supervisor, a fork of it, adopts it when the run starts (run/start.py) and releases it when the run
ends, or keeps it for `keep_s` after a failure while attempts remain (job.restarts); `stop` releases
it too. A queue entry's owner is the receiving process of the waiting launch (or, after
`--detach --wait`, the detached waiter that holds the pushed job: share/waiter.py).

Admission (judge, pure) of a request (slots; GPUs: candidates "auto" or indices, and how many; the
host's capacity in slots, by default its CPUs; its ticket):
  - its GPUs must be in no live claim of another run; free ones are chosen (gpus.choose);
  - the slots of other runs' live claims plus its own must fit the capacity, unless no other run holds
    any here (a run larger than the host's capacity runs when it has the host to itself);
  - no earlier waiter (live queue entry of another run with a smaller ticket) could use what it takes:
    the slots, when both would not fit together; GPUs the waiter named or, naming only a count, any;
  - when only a younger launch's tentative claim is in the way, the request is retried (that launch is
    deciding, and gives way to an older one at once); an older one's, or any held claim, is busy.
Launches give way to older tickets only, so of two launches started at once for the same hosts, the
older one gets them and the other is told busy (or queues): never both.

Command `claims DIR...`: every entry in these folders (any user's), as JSON on one line.
"""

import os
import time

from ..procs import start_ticks
from ..wire import Fail, reply
from . import gpus as gpu_choice
from .folder import DEFAULT_DIR, Folder, user_name

VERSION = 1
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_SAFE_REST = _ALNUM | frozenset("._-")


def safe(text):
    """A run id or node name fit for a claim's file name: [A-Za-z0-9][A-Za-z0-9._-]{0,127} (no regex: re
    is not loaded on the push's path, stdlib.py)."""
    return 0 < len(text) <= 128 and text[0] in _ALNUM and all(c in _SAFE_REST for c in text[1:])


def cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def brief(entry):
    """What a host says of an entry in an answer or a listing."""
    keys = ("kind", "user", "uid", "by", "run", "node", "slots", "gpus", "since", "state", "ticket", "live",
            "keep_until", "pid")
    return dict((k, entry.get(k)) for k in keys)


# ------------------------------------------------------------------ the rule (pure)


def ticket_of(entry):
    t = entry.get("ticket") or [0, ""]
    return (float(t[0]), str(t[1]))


def judge(req, entries, host_gpus, capacity):
    """Whether the request may take its share here now: {"granted": gpu indices} or {"blocked": ...,
    "holders": [entries in the way], "ahead": [earlier waiters in the way], "retry": bool} or {"error"}.
    req: {"uid", "run", "node", "slots", "gpus" (None, "auto" or indices), "gpu_count", "ticket"}."""
    tick = (float(req["ticket"][0]), str(req["ticket"][1]))
    claims, waiters, taken = _standing(req, entries, tick)
    chosen, holders = [], []
    if req.get("gpus") is not None:
        chosen, gpu_error, holders = _gpus(req, host_gpus, taken, claims, waiters)
        if gpu_error:
            return {"error": gpu_error}
    used = sum(_slots(e, capacity) for e in claims)
    if claims and used + req["slots"] > capacity:
        holders = claims
    # the arithmetic, for the words of a busy answer: what the run needs, what the host offers and holds
    sums = {"need": req["slots"], "capacity": capacity, "used": used,
            "gpus_wanted": req.get("gpu_count", req["slots"]) if req.get("gpus") is not None else 0,
            "gpus": len(host_gpus)}
    if holders:
        younger = all(e["state"] == "tentative" and ticket_of(e) > tick for e in holders)
        return _blocked(holders, [], waiters, retry=younger, sums=sums)
    ahead = [w for w in waiters if _could_use(w, req, chosen, used, capacity)]
    if ahead:
        return _blocked([], ahead, waiters, retry=False, sums=sums)
    return {"granted": chosen}


def _standing(req, entries, tick):
    """Other runs' live claims, the live queue entries of other runs ahead of this one (smaller ticket),
    and the GPUs taken here (also by this run's other nodes on the same machine)."""
    me = (req["uid"], req["run"])
    mine, others = [], []
    for e in entries:
        if e["live"]:
            (mine if (e["uid"], e["run"]) == me else others).append(e)
    claims = [e for e in others if e["kind"] == "claim"]
    waiters = [e for e in others if e["kind"] == "queue" and ticket_of(e) < tick]
    siblings = [e for e in mine if e["kind"] == "claim" and e["node"] != req["node"]]
    taken = set(i for e in claims + siblings for i in e["gpus"])
    return claims, waiters, taken


def _gpus(req, host_gpus, taken, claims, waiters):
    """(chosen indices, error, claims in the way) for the request's GPUs."""
    cands, problem = gpu_choice.candidates(req["gpus"], host_gpus)
    count = req.get("gpu_count", req["slots"])
    if problem:
        return [], problem, []
    if len(cands) < count:
        have = "%d GPU%s" % (len(cands), "" if len(cands) == 1 else "s")
        return [], "slots: %d but this host has %s to give (one GPU per rank)" % (count, have), []
    reserved = set(i for w in waiters if isinstance(w["gpus"], list) for i in w["gpus"])
    chosen = gpu_choice.choose(cands, count, taken, reserved)
    if chosen is not None:
        return chosen, "", []
    wanted = set(g["index"] for g in cands)
    return [], "", [e for e in claims if wanted & set(e["gpus"])]


def _slots(entry, capacity):
    """An entry's slots, never more than the host has: no entry counts for more than a whole host."""
    return max(0, min(entry["slots"], capacity))


def _could_use(waiter, req, chosen, used, capacity):
    """Would taking `chosen` GPUs and req's slots now keep this earlier waiter waiting longer?"""
    if used + req["slots"] + _slots(waiter, capacity) > capacity:
        return True
    if not chosen:
        return False
    return waiter["gpus"] == "any" and waiter.get("gpu_count", 1) > 0 or \
        isinstance(waiter["gpus"], list) and bool(set(waiter["gpus"]) & set(chosen))


def _blocked(holders, ahead, waiters, retry, sums=None):
    position = 1 + len(waiters)
    return {"blocked": True, "holders": [brief(e) for e in holders], "ahead": [brief(e) for e in ahead],
            "position": position, "retry": retry, "sums": sums or {}}


# ------------------------------------------------------------------ one run's entries on this host


def checked_conf(conf):
    """A claim request from the controller, its names checked (they become file names)."""
    if not isinstance(conf, dict) or not all(safe(str(conf.get(k, ""))) for k in ("run", "node")):
        raise Fail("bad claim request", "protocol")
    return conf


class Claims:
    """This run's entries on this host (node conf["node"]): take, queue, confirm, hand over, release."""

    def __init__(self, conf, host_gpus=None):
        self.conf = checked_conf(conf)
        self.folder = Folder(conf.get("dir")).ensure()
        self.name = "%d-%s-%s" % (self.folder.uid, conf["run"], conf["node"])
        self.host_gpus = host_gpus or []
        cap = conf.get("capacity")
        self.capacity = cap if isinstance(cap, int) and cap > 0 else cpus()
        self.gpus = []  # what the claim holds, once taken

    def request(self):
        c = self.conf
        return {"uid": self.folder.uid, "run": c["run"], "node": c["node"], "slots": int(c["slots"]),
                "gpus": c.get("gpus"), "gpu_count": int(c.get("gpu_count", c["slots"])),
                "ticket": c.get("ticket") or [time.time(), c["run"]]}

    def entry(self, kind, state, gpus, pid=None, ticks=None, **extra):
        c = self.conf
        pid = pid or os.getpid()
        body = {"version": VERSION, "kind": kind, "run": c["run"], "node": c["node"], "by": str(c.get("by") or ""),
                "pid": pid, "ticks": ticks if ticks is not None else start_ticks(pid), "slots": int(c["slots"]),
                "gpus": gpus, "gpu_count": int(c.get("gpu_count", c["slots"])) if c.get("gpus") is not None else 0,
                "since": time.time(), "ticket": self.request()["ticket"], "state": state}
        body.update(extra)
        return body

    def admit(self, take=True, queue=False):
        """judge under the lock, and in the same step: when granted and take, write the claim (tentative);
        when blocked for good and queue, the queue entry (so nobody younger slips in between)."""
        held = self.folder.lock()
        try:
            verdict = judge(self.request(), self.folder.entries(), self.host_gpus, self.capacity)
            if "granted" in verdict and take:
                self.gpus = verdict["granted"]
                self.folder.write(self.name + ".claim", self.entry("claim", "tentative", self.gpus))
            elif queue and verdict.get("blocked") and not verdict.get("retry"):
                self.enqueue()
            return verdict
        finally:
            held.close()

    def enqueue(self, pid=None, ticks=None):
        """A queue entry of ours (made once; it keeps its ticket, so its place in line)."""
        if not os.path.exists(os.path.join(self.folder.path, self.name + ".queue")):
            self.folder.write(self.name + ".queue", self.entry("queue", "waiting", self.named(), pid, ticks))

    def named(self):
        """What a queue entry says of its GPUs: the ones named (one per rank), any, or none."""
        g = self.conf.get("gpus")
        if g is None:
            return []
        return list(g) if isinstance(g, list) and len(g) == int(self.conf.get("gpu_count", len(g))) else "any"

    def requeue(self):
        """Back in line: the claim dropped and the queue entry made in one step (under the lock)."""
        held = self.folder.lock()
        try:
            self.folder.remove(self.name + ".claim")
            self.gpus = []
            self.enqueue()
        finally:
            held.close()

    def dequeue(self):
        self.folder.remove(self.name + ".queue")

    def set_claim(self, state, pid=None, ticks=None, **extra):
        self.folder.write(self.name + ".claim", self.entry("claim", state, self.gpus, pid, ticks, **extra))

    def release(self):
        self.folder.remove(self.name + ".claim")
        self.dequeue()


# ------------------------------------------------------------------ the supervisor's part (run/start.py)


def hand_over(conf, gpus):
    """What the start spec carries for the supervisor: the claim to adopt (node and GPUs as taken)."""
    out = dict(conf)
    out["taken_gpus"] = list(gpus)
    return out


def adopt(conf):
    """The supervisor (this process) owns the run's claim now. A restart's start finds it kept for it,
    or, if it is gone, claims anew, its GPUs the ones its ranks were given (Fail when that is busy now)."""
    taken = list(conf.get("taken_gpus") or [])
    if conf.get("gpus") is not None:
        conf = dict(conf, gpus=taken, gpu_count=len(taken))
    claims = Claims(conf)
    claims.gpus = taken
    held = claims.folder.lock()
    try:
        if not os.path.exists(os.path.join(claims.folder.path, claims.name + ".claim")):
            verdict = judge(claims.request(), claims.folder.entries(), [], claims.capacity)
            if "granted" not in verdict:
                raise Fail("host busy: %s" % describe(verdict), "busy")
        claims.set_claim("running", started_at=time.time())
    finally:
        held.close()
    return claims


def at_end(conf, failed):
    """The supervisor ends: release the claim, or keep it for the run's next attempt (keep_s) after a
    failure while attempts remain."""
    try:
        claims = Claims(conf)
    except Fail:
        return
    keep = float(conf.get("keep_s") or 0)
    if failed and keep > 0:
        claims.gpus = list(conf.get("taken_gpus") or [])
        claims.set_claim("kept", keep_until=time.time() + keep)
    else:
        claims.release()


def release(conf, owner=None):
    """Remove the run's claim and queue entry on this host (stop, an orphaned run); never fails. owner:
    only if that process owns the claim (a dead supervisor's, not a later attempt's)."""
    try:
        claims = Claims(conf)
        if owner is not None:
            mine = claims.folder.read(claims.name + ".claim")
            if mine is None or mine["pid"] != owner:
                return
        claims.release()
    except (Fail, OSError):
        pass


def describe(verdict):
    """One line: who is in the way."""
    holders = verdict.get("holders") or []
    ahead = verdict.get("ahead") or []
    parts = ["%s's run %s (%s)" % (e["user"], e["run"], e["state"]) for e in holders]
    parts += ["%s's run %s waiting ahead" % (e["user"], e["run"]) for e in ahead]
    return ", ".join(parts) or verdict.get("error", "busy")


# ------------------------------------------------------------------ the `claims` command


def cmd_claims(*dirs):
    """Every entry of these folders, any user's, live or not, and this host's clock and CPUs."""
    out = {}
    for path in dirs or (DEFAULT_DIR,):
        folder = Folder(path)
        out[folder.path] = [brief(e) for e in folder.entries(prune=False)] if os.path.isdir(folder.path) else []
    reply({"dirs": out, "now": time.time(), "cpus": cpus(), "user": user_name(os.getuid())})
    return 0
