"""State files: JSON written atomically (temp file + rename, mode 0600), read back as None when absent
or half-written by a writer that died. And every file the host program opens in a folder that a rank
(or another user, in the claims folder) can write: opened so that what was planted there cannot stall
or redirect it (open_regular), and read with a size cap (read_capped)."""

import errno
import os
import stat

from .stdlib import json

# a FIFO opens at once instead of waiting for a writer, a symlink is refused, nothing leaks into children
GUARDED = os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
STATE_CAP = 16 << 20  # a state file past this is not one the host program wrote


def open_regular(path, flags=os.O_RDONLY, mode=0o600):
    """An fd of path, opened O_NONBLOCK|O_NOFOLLOW and checked to be a regular file: a FIFO, a device
    or a symlink put in its place raises OSError (ELOOP, ENXIO or EINVAL) instead of blocking this
    process for ever or sending it elsewhere. O_NONBLOCK means nothing for a regular file's reads and
    writes, so the fd is used as any other."""
    fd = os.open(path, flags | GUARDED, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device or a folder put there?)", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(path, cap, offset=0):
    """At most cap bytes of a regular file from offset (open_regular's checks; OSError otherwise)."""
    fd = open_regular(path)
    try:
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        parts, left = [], cap
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def regular_size(path):
    """The size of path if it is a regular file (not followed through a symlink), else 0."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def write_json_atomic(path, obj, exclusive=False):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:  # a leftover (or something a rank put at this name: a FIFO would block the open) goes first
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | GUARDED, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
        # no fsync: the rename is atomic for every reader and survives this process being killed, which is
        # what the state files are for; an fsync per record cost milliseconds on the start's critical path
    if exclusive:
        try:
            os.link(tmp, path)  # fails if another writer got there first
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
        finally:
            os.unlink(tmp)
    else:
        os.replace(tmp, path)


def read_json(path, cap=STATE_CAP):
    """The JSON in path, or None (absent, half-written, not a regular file, or larger than cap)."""
    try:
        data = read_capped(path, cap + 1)
        return None if len(data) > cap else json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
