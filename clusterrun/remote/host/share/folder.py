"""The claims folder's files (the format and the rule: claims.py), read and locked so that another user
of the host, who can write to the folder, cannot stall, fool or outwait the launches of everyone else.

What another user can put in the folder, and what becomes of it here:
  - anything in place of an entry (a FIFO, a symlink, a device, a huge or half-written file, garbage JSON,
    a file named for another uid): opened O_NONBLOCK|O_NOFOLLOW, read only if a regular file of at most
    MAX_ENTRY bytes owned by the uid its name says, then checked field by field; else ignored;
  - an entry of their own naming a process that is not theirs (pid 1, with its start time): live only
    while its pid is alive, is the process it names (start ticks) and runs as the entry file's owner
    (its real uid, /proc/PID/status), so never live for a process of another user;
  - a huge slot count: judge counts no entry for more than the host's capacity (claims.py); a claim kept
    for a next attempt with no process behind it (keep_until far ahead): not past KEEP_MAX after the
    file was written (its ctime, which its owner cannot set);
  - the lock (one flock, held for a check-and-take, milliseconds): taken on the folder itself, which no
    user can replace (the folder is checked: a real folder, sticky where others may write), and on its
    .lock file as well for host programs of older versions that lock only that. .lock is opened
    without O_CREAT first and made with O_EXCL only where absent, so that fs.protected_regular (on by
    default on Ubuntu and Debian: in a sticky world-writable folder an O_CREAT open of another user's
    existing file is refused) never stops a user from opening the lock file someone else made; one that
    is not a regular file (a FIFO planted there) is left alone: the folder's own lock still counts.
    Anyone who can read the folder can hold its flock, and no file mode prevents that: a launch that
    waited LOCK_WAIT seconds for it says who holds it (the process, its user and command, from
    /proc/locks) instead of blocking for ever.
"""

import errno
import fcntl
import os
import stat
import time

from ..stdlib import json
from ..files import GUARDED, read_capped
from ..procs import exists, owner_uid
from ..wire import SAY_AFTER, Fail, note

DEFAULT_DIR = "/tmp/clusterrun-claims"
MAX_ENTRY = 64 << 10
LOCK_WAIT = 20.0
KEEP_MAX = 24 * 3600.0  # a kept claim (no process behind it) counts this long at most after it was written
KINDS = {".claim": "claim", ".queue": "queue"}
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def user_name(uid):
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


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
        """The folder's lock, held until the returned Lock is closed."""
        try:
            fds = [os.open(self.path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)]
        except OSError as exc:
            raise Fail("cannot open the claims folder: %s" % os.strerror(exc.errno), "claims", self.path) from None
        compat = self._lock_file()
        if compat is not None:
            fds.append(compat)
        held = Lock([])
        start = time.time()
        deadline = start + LOCK_WAIT
        said = False
        for fd in fds:
            while not _try_flock(fd):
                if not said and time.time() - start > SAY_AFTER:
                    said = True  # said while it waits: the controller quotes it if its answer is late
                    note("waiting for the claims folder's lock (%s)%s" % (self.path, lock_holder(os.fstat(fd))))
                if time.time() > deadline:
                    holder = lock_holder(os.fstat(fd))
                    held.close()
                    for rest in fds[len(held.fds):]:
                        os.close(rest)
                    raise Fail("the claims folder's lock stayed taken for %g s%s" % (LOCK_WAIT, holder),
                               "claims", self.path)
                time.sleep(0.005)
            held.fds.append(fd)
        return held

    def _lock_file(self):
        """.lock, opened without O_CREAT (fs.protected_regular) unless absent; None if it is not a regular
        file or cannot be opened (the folder's own lock is enough for this version)."""
        name = os.path.join(self.path, ".lock")
        fd = None
        for _ in range(3):
            try:
                fd = os.open(name, os.O_RDONLY | GUARDED)
                break
            except FileNotFoundError:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_EXCL | GUARDED, 0o644)
                    os.fchmod(fd, 0o644)  # made under our umask: every user must be able to open it
                    break
                except FileExistsError:
                    continue  # another launch made it just now: open that one
                except OSError:
                    return None
            except OSError:
                return None
        if fd is None:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

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
            entry = self.read(name)
            if entry is None:
                continue
            entry["live"] = live(entry, now)
            if prune and not entry["live"] and entry["uid"] == self.uid:
                self.remove(name)
            out.append(entry)
        return out

    def read(self, name):
        """The entry in file `name`, or None when it is not one (see the top of this file)."""
        kind = KINDS.get(os.path.splitext(name)[1])
        if kind is None or name.startswith("."):
            return None
        path = os.path.join(self.path, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY or not name.startswith("%d-" % st.st_uid):
                return None
            data = read_capped(path, MAX_ENTRY + 1)
            after = os.lstat(path)
            if len(data) > MAX_ENTRY or (after.st_ino, after.st_uid) != (st.st_ino, st.st_uid):
                return None  # replaced between the look and the read
            data = json.loads(data.decode("utf-8"))
        except (OSError, ValueError):
            return None
        if not well_formed(data, kind):
            return None
        # ctime: when the file was written, which its owner cannot set back (utime sets mtime only)
        data.update(file=name, uid=st.st_uid, user=user_name(st.st_uid), kind=kind, written=st.st_ctime)
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


class Lock:
    """The folder's flocks, released on close."""

    def __init__(self, fds):
        self.fds = fds

    def close(self):
        while self.fds:
            os.close(self.fds.pop())


def _try_flock(fd):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise Fail("cannot lock the claims folder: %s" % os.strerror(exc.errno), "claims") from None
        return False


def lock_holder(st, locks="/proc/locks"):
    """' by pid P (user U: COMMAND)' for the process /proc/locks says holds a flock on the file st is of,
    or what can be said without it."""
    try:
        with open(locks, "rb") as fh:
            lines = fh.read(1 << 20).decode("ascii", "replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or "->" in fields[:2] or fields[1] != "FLOCK":
            continue
        try:
            pid, inode = int(fields[4]), int(fields[5].rsplit(":", 1)[1])
        except (ValueError, IndexError):
            continue
        if inode == st.st_ino and pid > 0:
            uid = owner_uid(pid)
            who = user_name(uid) if uid is not None else "a user whose processes this one cannot see"
            return " by pid %d (user %s: %s): it holds it wrongly; ask them, or root, to end it" % (
                pid, who, _command(pid) or "its command hidden")
    return " (its holder is not named in /proc/locks: a process of another machine on a shared filesystem?)"


def _command(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            argv = fh.read(4096).split(b"\0")
    except OSError:
        return ""
    return " ".join(a.decode("utf-8", "replace") for a in argv if a)[:200]


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _ticket(value):
    """[TIME, RUN] with TIME a number and not NaN (NaN would sort anywhere in the line)."""
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], (int, float)) \
        and not isinstance(value[0], bool) and value[0] == value[0]


def _gpus(value):
    return value == "any" or isinstance(value, list) and all(_int(i) for i in value)


def well_formed(data, kind):
    """Every field the rule reads there, of its type (an entry is anyone's file: nothing else is assumed)."""
    if not isinstance(data, dict) or data.get("kind") != kind:
        return False
    if not (_int(data.get("pid")) and _int(data.get("slots")) and data["pid"] > 0 and data["slots"] >= 0):
        return False
    if not all(isinstance(data.get(k), str) for k in ("run", "node", "state")):
        return False
    return _ticket(data.get("ticket")) and _gpus(data.get("gpus"))


def live(entry, now):
    """Its owner process lives, is the one recorded, and is the entry file's owner's; or a claim is kept
    for its run's next attempt (keep_until, never past KEEP_MAX after the file was written)."""
    alive = exists(entry["pid"], entry.get("ticks"))
    if alive is None:  # another user's process we cannot see (hidepid): take their word for it
        return True
    if alive and owner_uid(entry["pid"]) not in (entry["uid"], None):
        alive = False  # a process of someone else's: an entry cannot borrow it to stay live
    keep = entry.get("keep_until")
    kept = isinstance(keep, (int, float)) and keep > now and now < entry.get("written", now) + KEEP_MAX
    return bool(alive) or entry["kind"] == "claim" and kept
