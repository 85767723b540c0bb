"""Claims: a run says which slots and GPUs it uses on this host, in a folder every user of the host sees,
so that a launch finds a busy host before it pushes anything, and waiting launches take turns. No daemon,
no root: files, a lock, and the owners' process ids.

The folder (`claims: {dir: ...}` in the inventory, default DEFAULT_DIR) is made like /tmp itself: sticky
and world-writable (1777), so everyone can add entries and only an entry's owner (or root) can remove
it. An existing one must be sticky or not writable by others (else anyone could remove anyone's claims).
In it, one file per entry, owned by its user, mode 0644 (everyone reads):

  UID-RUN-NODE.claim   run RUN (node NODE of it) holds slots and GPUs here
  UID-RUN-NODE.queue   run RUN waits for them (`launch --wait`)
  .lock                flock'ed around every check-and-take: two launches cannot both win

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

Live or stale: an entry is live while its owner process is (pid and start ticks match; /proc shows them
for every user's processes), a claim also until its keep_until. A stale entry is ignored, and removed
when this user may (its own). Where /proc hides other users' processes (hidepid), theirs count as live.

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

import errno
import fcntl
import json
import os
import pwd
import re
import stat
import time

from ..procs import exists, start_ticks
from ..wire import Fail, reply
from . import gpus as gpu_choice

DEFAULT_DIR = "/tmp/clusterrun-claims"
VERSION = 1
MAX_ENTRY = 64 << 10
LOCK_WAIT = 20.0
KINDS = {".claim": "claim", ".queue": "queue"}
SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ------------------------------------------------------------------ the folder


class Folder:
    """The claims folder: made if missing (1777), checked, locked, listed, written."""

    def __init__(self, path):
        self.path = os.path.expanduser(path or DEFAULT_DIR)
        self.uid = os.getuid()

    def ensure(self):
        try:
            os.mkdir(self.path, 0o700)
            os.chmod(self.path, 0o1777)  # what mkdir's mode cannot say past the umask
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise Fail("cannot make the claims folder: %s" % os.strerror(exc.errno), "claims",
                           self.path) from None
        st = os.lstat(self.path)
        if not stat.S_ISDIR(st.st_mode):
            raise Fail("the claims folder is not a folder (a symlink?)", "claims", self.path)
        if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            raise Fail("the claims folder is writable by everyone but not sticky: any user could remove "
                       "the claims in it (chmod +t %s, or point claims: {dir: ...} elsewhere)" % self.path,
                       "claims", self.path)
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise Fail("this user cannot write to the claims folder (owner uid %d, mode %o)"
                       % (st.st_uid, stat.S_IMODE(st.st_mode)), "claims", self.path)
        return self

    def lock(self):
        """The folder's lock, held until the returned fd is closed."""
        name = os.path.join(self.path, ".lock")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644)
        except OSError as exc:
            raise Fail("cannot open the claims lock: %s" % os.strerror(exc.errno), "claims", name) from None
        st = os.fstat(fd)
        if st.st_uid == self.uid and stat.S_IMODE(st.st_mode) != 0o644:
            os.fchmod(fd, 0o644)  # made under our umask: every user must be able to open it
        deadline = time.time() + LOCK_WAIT
        while True:  # held only for a check-and-take (milliseconds): longer means something holds it wrongly
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.time() > deadline:
                    os.close(fd)
                    raise Fail("the claims folder's lock stayed taken for %g s (a process holding %s?)"
                               % (LOCK_WAIT, name), "claims", name) from None
            time.sleep(0.005)

    def entries(self, now=None, prune=True):
        """Every well-formed entry here, each with "file", "uid", "user", "kind", "live"; with prune
        (only under the lock), stale ones of this user removed (they stay in the list, not live)."""
        now = time.time() if now is None else now
        try:
            names = sorted(os.listdir(self.path))
        except OSError:
            return []
        out = []
        for name in names:
            entry = self._read(name)
            if entry is None:
                continue
            entry["live"] = _live(entry, now)
            if prune and not entry["live"] and entry["uid"] == self.uid:
                self.remove(name)
            out.append(entry)
        return out

    def _read(self, name):
        kind = KINDS.get(os.path.splitext(name)[1])
        if kind is None or name.startswith("."):
            return None
        try:
            fd = os.open(os.path.join(self.path, name), os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY or not name.startswith("%d-" % st.st_uid):
                return None
            data = json.loads(os.read(fd, MAX_ENTRY).decode("utf-8"))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        if not _well_formed(data, kind):
            return None
        data.update(file=name, uid=st.st_uid, user=user_name(st.st_uid), kind=kind)
        return data

    def write(self, name, entry):
        """An entry of ours, atomically (temp file + rename: a reader sees the old one or the new one)."""
        tmp = os.path.join(self.path, ".tmp-%d-%d-%s" % (self.uid, os.getpid(), os.urandom(4).hex()))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, json.dumps(entry).encode())
        finally:
            os.close(fd)
        try:
            os.rename(tmp, os.path.join(self.path, name))
        except OSError as exc:
            os.unlink(tmp)
            raise Fail("cannot write the claim %s: %s" % (name, os.strerror(exc.errno)), "claims",
                       self.path) from None

    def remove(self, name):
        try:
            os.unlink(os.path.join(self.path, name))
        except OSError:
            pass


def _well_formed(data, kind):
    if not isinstance(data, dict) or data.get("kind") != kind:
        return False
    ints = ("pid", "slots")
    if not all(isinstance(data.get(k), int) and not isinstance(data.get(k), bool) for k in ints):
        return False
    if not all(isinstance(data.get(k), str) for k in ("run", "node", "state")):
        return False
    ticket = data.get("ticket")
    if not (isinstance(ticket, list) and len(ticket) == 2 and isinstance(ticket[0], (int, float))):
        return False
    g = data.get("gpus")
    return g == "any" or isinstance(g, list) and all(isinstance(i, int) for i in g)


def _live(entry, now):
    alive = exists(entry["pid"], entry.get("ticks"))
    if alive is None:  # another user's process we cannot see (hidepid): take their word for it
        return True
    keep = entry.get("keep_until")
    return bool(alive) or entry["kind"] == "claim" and isinstance(keep, (int, float)) and keep > now


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
    used = sum(e["slots"] for e in claims)
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


def _could_use(waiter, req, chosen, used, capacity):
    """Would taking `chosen` GPUs and req's slots now keep this earlier waiter waiting longer?"""
    if used + req["slots"] + waiter["slots"] > capacity:
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
    if not isinstance(conf, dict) or not all(SAFE.match(str(conf.get(k, ""))) for k in ("run", "node")):
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
        fd = self.folder.lock()
        try:
            verdict = judge(self.request(), self.folder.entries(), self.host_gpus, self.capacity)
            if "granted" in verdict and take:
                self.gpus = verdict["granted"]
                self.folder.write(self.name + ".claim", self.entry("claim", "tentative", self.gpus))
            elif queue and verdict.get("blocked") and not verdict.get("retry"):
                self.enqueue()
            return verdict
        finally:
            os.close(fd)

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
        fd = self.folder.lock()
        try:
            self.folder.remove(self.name + ".claim")
            self.gpus = []
            self.enqueue()
        finally:
            os.close(fd)

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
    fd = claims.folder.lock()
    try:
        if not os.path.exists(os.path.join(claims.folder.path, claims.name + ".claim")):
            verdict = judge(claims.request(), claims.folder.entries(), [], claims.capacity)
            if "granted" not in verdict:
                raise Fail("host busy: %s" % describe(verdict), "busy")
        claims.set_claim("running", started_at=time.time())
    finally:
        os.close(fd)
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
            mine = claims.folder._read(claims.name + ".claim")
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
