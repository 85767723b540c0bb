"""Locks on this host's workdir: the content cache's (shared by pushes, exclusive by a sweep), the
receiving end's mark on a run folder it is making (`clean` leaves such a folder alone), and a run
folder's own lock, which `start` holds while it starts an attempt and `clean` while it decides and
removes (so a restart starting as `clean` looks never starts in a folder that is about to go)."""

import fcntl
import os
import time

from ..wire import SAY_AFTER, note

LOCK_WAIT = 60.0  # how long a sweep waits for pushes in flight to finish with the cache


def cache_lock(workdir, exclusive, wait):
    """An open lock file on the cache, held (shared by pushes, exclusive by a sweep); None when the wait
    ran out. Closing the file releases it."""
    folder = os.path.join(workdir, "cache")
    os.makedirs(folder, 0o700, exist_ok=True)
    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    start = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            waited = time.monotonic() - start
            if waited >= wait:
                os.close(fd)
                return None
            if not said and waited >= SAY_AFTER:
                said = True
                note("waiting for the content cache's lock (%s): %s holds it" % (
                    os.path.join(folder, "lock"), "a push" if exclusive else "a cache sweep (clean)"))
            time.sleep(0.02)


def hold_receiving(run_dir):
    """The receiving end's mark on a run folder it is making: an exclusive lock kept until it exits."""
    fd = os.open(os.path.join(run_dir, ".receiving"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def being_received(run_dir):
    return held(os.path.join(run_dir, ".receiving"))


def held(path):
    """Whether some process holds an exclusive flock on this file now (False when there is no file)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def run_lock(run_root, wait):
    """The run folder's lock (a flock on the folder itself: no file, no inode on a full disk), held until
    the fd is closed; None when it stays taken for `wait` seconds (0: do not wait) or the folder is gone."""
    try:
        fd = os.open(run_root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.02)
