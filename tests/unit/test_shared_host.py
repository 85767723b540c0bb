"""What another user of the host can do to the claims folder (issue 32, finding 1; docs/security.md): with a
second unix user (otheruser.py) planting a FIFO as the lock file, holding the lock, forging a queue entry
that names pid 1; the fs.protected_regular rule on the lock file; and a fuzz test of whatever may lie in
the folder (FIFOs, symlinks, huge files, wrong owners, garbage JSON)."""

import contextlib
import errno
import json
import os
import random
import signal
import stat
import time

import pytest

from clusterrun.remote.host.procs import start_ticks
from clusterrun.remote.host.share import folder as F
from clusterrun.remote.host.share.claims import Claims, judge
from clusterrun.remote.host.wire import Fail
from otheruser import OTHER, as_other, needs_root


@contextlib.contextmanager
def deadline(seconds):
    """Fail the test (instead of hanging the lane) if the block takes longer: a blocked open or read
    is interrupted by the alarm's exception."""
    def expired(signum, frame):
        raise TimeoutError("blocked for more than %g s" % seconds)

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def conf(folder, run, slots=1, capacity=4, ticket=None):
    return {"dir": folder, "run": run, "node": "n0", "by": "me@here", "slots": slots, "capacity": capacity,
            "ticket": [ticket or time.time(), run]}


def made_by_root(shared_tmp):
    """The claims folder as README advises: made by root, sticky and world-writable."""
    path = os.path.join(shared_tmp, "claims")
    F.Folder(path).ensure()
    return path


# -------------------------------------------------------------- a second user


@needs_root
def test_a_fifo_planted_as_the_lock_file_stalls_no_launch(shared_tmp):
    folder = made_by_root(shared_tmp)
    as_other("import os, sys; os.mkfifo(os.path.join(sys.argv[1], '.lock'), 0o666)", folder)
    assert stat.S_ISFIFO(os.lstat(os.path.join(folder, ".lock")).st_mode)
    with deadline(10):
        assert Claims(conf(folder, "r1")).admit() == {"granted": []}
        assert Claims(conf(folder, "r2", slots=4)).admit(take=False)["holders"][0]["run"] == "r1"


HOLD = r"""
import fcntl, os, sys, time
fds = [os.open(sys.argv[1], os.O_RDONLY), os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDONLY)]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@needs_root
def test_a_lock_held_for_ever_by_another_user_is_named_in_the_error(shared_tmp, monkeypatch, capsys):
    folder = made_by_root(shared_tmp)
    F.Folder(folder).lock().close()  # .lock made (by root, 0644: readable by all, so lockable by all)
    holder = as_other(HOLD, folder, background=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(F, "LOCK_WAIT", 0.3)
        monkeypatch.setattr(F, "SAY_AFTER", 0.05)
        with deadline(10), pytest.raises(Fail) as err:
            Claims(conf(folder, "r1")).admit()
        assert "by pid %d (user nobody: " % holder.pid in str(err.value) and "time.sleep" not in str(err.value)
        assert "ask them, or root, to end it" in str(err.value)
        said = capsys.readouterr().err  # said while it waited (a late push answer quotes it: hosts/failures.py)
        assert said.startswith("waiting for the claims folder's lock (%s) by pid %d" % (folder, holder.pid)), said
    finally:
        holder.kill()
        holder.wait()
    assert Claims(conf(folder, "r1")).admit() == {"granted": []}


FORGE = r"""
import json, os, sys
folder, ticks = sys.argv[1], int(sys.argv[2])
entry = {"version": 1, "kind": "queue", "run": "forged", "node": "n0", "by": "x@y", "pid": 1, "ticks": ticks,
         "slots": 10 ** 9, "gpus": "any", "gpu_count": 8, "since": 0.0, "ticket": [0, "a"], "state": "waiting"}
with open(os.path.join(folder, "%d-forged-n0.queue" % os.getuid()), "w") as fh:
    json.dump(entry, fh)
"""


@needs_root
def test_a_forged_queue_entry_naming_pid_1_stands_ahead_of_nobody(shared_tmp):
    """Another user's entry, the smallest ticket, a huge slot count, pid 1 with pid 1's start time: pid 1
    is not theirs, so the entry is stale and every other launch goes ahead."""
    folder = made_by_root(shared_tmp)
    as_other(FORGE, folder, start_ticks(1))
    (forged,) = F.Folder(folder).entries(prune=False)
    assert forged["uid"] == OTHER and forged["pid"] == 1 and forged["live"] is False
    assert Claims(conf(folder, "r1", ticket=5.0)).admit() == {"granted": []}


@needs_root
def test_an_entry_of_the_other_users_own_live_process_stands_in_line(shared_tmp):
    """The same entry naming a process of the entry's owner is live: the queue trusts its ticket (README)."""
    folder = made_by_root(shared_tmp)
    sleeper = as_other("import time; print('up', flush=True); time.sleep(60)", background=True)
    try:
        assert sleeper.stdout.readline().strip() == "up"
        as_other(FORGE.replace('"pid": 1', '"pid": %d' % sleeper.pid), folder, start_ticks(sleeper.pid))
        (entry,) = F.Folder(folder).entries(prune=False)
        assert entry["live"] is True
        verdict = Claims(conf(folder, "r1", ticket=5.0)).admit(take=False)
        assert [e["run"] for e in verdict["ahead"]] == ["forged"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_no_entry_counts_for_more_slots_than_the_host_has():
    huge = {"kind": "claim", "run": "other", "uid": 1001, "user": "u", "node": "n0", "slots": 10 ** 9, "gpus": [],
            "state": "running", "ticket": [1.0, "other"], "live": True, "pid": 7}
    verdict = judge({"uid": 0, "run": "mine", "node": "n0", "slots": 1, "gpus": None, "gpu_count": 1,
                     "ticket": [5.0, "mine"]}, [huge], [], capacity=4)
    assert verdict["sums"]["used"] == 4 and [e["run"] for e in verdict["holders"]] == ["other"]


def test_a_kept_claim_with_no_process_behind_it_counts_for_a_day_at_most(tmp_path):
    folder = str(tmp_path / "claims")
    c = Claims(conf(folder, "r1"))
    c.set_claim("kept", pid=2 ** 22 + 1, ticks=1, keep_until=time.time() + 10 ** 9)
    (entry,) = F.Folder(folder).entries(prune=False)
    assert entry["live"] is True
    assert F.live(entry, time.time() + F.KEEP_MAX + 1) is False


# -------------------------------------------------------------- fs.protected_regular


def protected_regular(real_open):
    """os.open under fs.protected_regular=1, as the kernel rules it (may_create_in_sticky): an O_CREAT open
    (without O_EXCL) of an existing regular file in a sticky world-writable folder is refused when the
    file is neither this user's nor the folder owner's."""
    def guarded(path, flags, mode=0o777, *, dir_fd=None):
        if flags & os.O_CREAT and not flags & os.O_EXCL:
            try:
                st, parent = os.lstat(path), os.stat(os.path.dirname(os.path.abspath(path)))
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode) and parent.st_mode & stat.S_ISVTX \
                    and parent.st_mode & 0o002 and st.st_uid not in (os.geteuid(), parent.st_uid):
                raise PermissionError(errno.EACCES, "Permission denied (fs.protected_regular)", path)
        return real_open(path, flags, mode, dir_fd=dir_fd)
    return guarded


def test_a_lock_file_another_user_made_opens_under_protected_regular(tmp_path, monkeypatch):
    """The folder is root's and sticky, .lock was made by another user (uid 1001 here): an O_CREAT open of
    it is refused where fs.protected_regular=1, so the lock is opened without O_CREAT first."""
    folder = tmp_path / "claims"
    F.Folder(str(folder)).ensure()
    lock = folder / ".lock"
    lock.write_text("")
    os.chown(lock, 1001, 1001) if os.geteuid() == 0 else pytest.skip("needs root to give the file away")
    monkeypatch.setattr(os, "open", protected_regular(os.open))
    c = Claims(conf(str(folder), "r1"))
    assert c.admit() == {"granted": []}
    held = c.folder.lock()
    try:
        assert len(held.fds) == 2 and os.fstat(held.fds[1]).st_ino == lock.stat().st_ino
    finally:
        held.close()


# -------------------------------------------------------------- fuzz


def plant(folder, rng, i, good):
    """One random thing in the folder, named like an entry (or not): returns nothing, it is the folder
    that is judged."""
    uid = os.getuid()
    name = os.path.join(folder, "%d-fuzz%d-n0.%s" % (rng.choice([uid, uid + 1]), i, rng.choice(["claim", "queue"])))
    kind = rng.randrange(9)
    if kind == 0:
        os.mkfifo(name)
    elif kind == 1:
        os.symlink(rng.choice(["/etc/passwd", good, "/nonexistent", name + ".fifo"]), name)
        if not os.path.exists(name + ".fifo"):
            os.mkfifo(name + ".fifo")
    elif kind == 2:
        with open(name, "wb") as fh:
            fh.truncate(rng.choice([F.MAX_ENTRY + 1, 1 << 30]))  # sparse: huge, costs nothing
    elif kind == 3:
        with open(name, "wb") as fh:
            fh.write(os.urandom(rng.randrange(1, 300)))
    elif kind == 4:
        os.mkdir(name)
    else:
        body = json.loads(open(good).read())
        key = rng.choice(sorted(body))
        body[key] = rng.choice([None, True, -1, 2 ** 70, "x", [], {}, [1, "a"], float("nan"), float("inf"), 1e308])
        text = json.dumps(body)
        with open(name, "w") as fh:
            fh.write(text[:rng.randrange(len(text) + 1)] if kind == 5 else text)


def test_fuzz_whatever_lies_in_the_folder_is_ignored_or_read_never_blocks_never_raises(tmp_path):
    rng = random.Random(32)
    for round_no in range(12):
        folder = str(tmp_path / ("claims%d" % round_no))
        holder = Claims(conf(folder, "real", slots=2))
        assert holder.admit() == {"granted": []}
        good = os.path.join(folder, "%d-real-n0.claim" % os.getuid())
        for i in range(25):
            plant(folder, rng, i, good)
        with deadline(20):
            entries = F.Folder(folder).entries(prune=False)
            for e in entries:
                assert F.well_formed(e, e["kind"]) and e["file"].startswith("%d-" % e["uid"])
                assert os.path.isfile(os.path.join(folder, e["file"])) and not os.path.islink(
                    os.path.join(folder, e["file"]))
            verdict = Claims(conf(folder, "next", slots=4, capacity=4)).admit(take=False)
        assert "real" in [e["run"] for e in verdict.get("holders", [])], verdict
        assert "error" not in verdict
