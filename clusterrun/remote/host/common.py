"""Shared by the host program's parts: errors as JSON, atomic state files, framed messages, paths."""

import errno
import json
import os
import socket
import struct
import sys


PROTOCOL = 1
FRAME = struct.Struct(">cIQI")  # type, rank, offset, payload length
CHUNK = 1 << 20
IDLE_SLEEP = 0.02
HEARTBEAT_EVERY = 1.0
CAT_LIMIT = 64 << 20

class Fail(Exception):
    """An expected failure, reported to the controller as JSON {"error", "kind", "path"}."""

    def __init__(self, message, kind="error", path=""):
        Exception.__init__(self, message)
        self.kind = kind
        self.path = path


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


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read_exact(stream, n):
    parts = []
    while n:
        chunk = stream.read(min(n, CHUNK))
        if not chunk:
            raise Fail("the controller went away during the push", "aborted")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_msg(stream):
    (n,) = struct.unpack(">I", read_exact(stream, 4))
    return json.loads(read_exact(stream, n).decode())


def send_msg(obj):
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(data)) + data)
    sys.stdout.buffer.flush()


ATTEMPT_PREFIX = "attempt-"


def run_root(run_dir):
    """The run's own folder: attempt K of a run (job.restarts) lives in RUN/attempt-K and shares RUN's job."""
    name = os.path.basename(run_dir)
    if name.startswith(ATTEMPT_PREFIX) and name[len(ATTEMPT_PREFIX):].isdigit():
        return os.path.dirname(run_dir)
    return run_dir


def job_dir(run_dir):
    return os.path.join(run_root(run_dir), "job")


def attempt_dirs(root):
    """The folders of attempts 1.. of a run, in order."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = [n for n in names if n.startswith(ATTEMPT_PREFIX) and n[len(ATTEMPT_PREFIX):].isdigit()]
    return [os.path.join(root, n) for n in sorted(found, key=lambda n: int(n[len(ATTEMPT_PREFIX):]))]


def exit_path(run_dir, rank):
    return os.path.join(run_dir, "rank-%d.exit" % rank)


def log_path(run_dir, rank):
    return os.path.join(run_dir, "rank-%d.log" % rank)


def free_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port
