"""State files: JSON written atomically (temp file + rename, mode 0600), read back as None when absent
or half-written by a writer that died."""

import errno
import json
import os


def write_json_atomic(path, obj, exclusive=False):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
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


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
