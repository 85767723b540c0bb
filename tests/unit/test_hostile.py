"""What a broken or hostile host, manifest or job can throw at clusterrun (issue 14): garbled frames end a
stream like a lost connection (never a hang), symlink chains and bad sizes are refused, a cached object a
job changed is fetched again, secrets are masked however they are split."""

import hashlib
import json
import os
import stat
import queue
import sys
import time

import pytest

from clusterrun.config.inventory import Timeouts
from clusterrun.errors import PushError
from clusterrun.hosts.client import HostClient
from clusterrun.hosts.follow import FollowDone, Follower, HostLost, LogFiles
from clusterrun.hosts.manifest import FileEntry, Manifest
from clusterrun.hosts.wire import FRAME, FollowStream
from clusterrun.remote.host.secrets import Masker
from clusterrun.transport import StreamClosed
from clusterrun.transport.local import LocalTransport, host_environment

sys.path.insert(0, os.path.dirname(__file__))
from hostkit import make_host, project  # noqa: E402


class BytesStream:
    """A transport stream that plays back fixed bytes, then ends."""

    def __init__(self, data):
        self.data = data

    def read(self, n, timeout):
        out, self.data = self.data[:n], self.data[n:]
        return out

    def wait(self, timeout):
        return 0

    def stderr(self):
        return b""

    def close(self):
        pass


def frame(kind, rank, offset, payload):
    return FRAME.pack(kind, rank, offset, len(payload)) + payload


class HostileClient:
    """Every follow gets the same garbage."""

    def __init__(self, data):
        self.data = data
        self.follows = 0

    def follow(self, run_id, offsets, once=False):
        self.follows += 1
        return FollowStream(BytesStream(self.data), "evil")


@pytest.mark.parametrize("garbage", [
    frame(b"L", 7, 0, b"a rank the world does not have\n"),
    frame(b"X", 0, 0, b"{not json"),
    frame(b"H", 0, 0, b"[1, 2]"),
    FRAME.pack(b"L", 0, 0, 0xFFFFFFF0),  # 4 GiB promised: judged on the header, nothing waited for
    b"Welcome to node3! Last login: ...\n" + bytes(40),  # a login shell that prints
    frame(b"L", 0, 100, b"bytes after a hole\n"),
])
def test_garbled_frames_make_the_host_lost_never_a_hang(tmp_path, garbage):
    out = queue.Queue()
    client = HostileClient(frame(b"H", 0, 0, json.dumps({"now": time.time()}).encode()) + garbage)
    f = Follower(node_rank=0, host="evil", ranks=[0, 1], files=LogFiles(rank=lambda r: str(tmp_path / f"r{r}")),
                 world_size=2, attempt_key="r", client=lambda reconnect: client, out=out, host_lost_s=30)
    f.start()
    f.join(timeout=10)
    assert not f.is_alive()
    events = []
    while not out.empty():
        events.append(out.get())
    lost = [e for e in events if isinstance(e, HostLost)]
    assert len(lost) == 1 and "garbled" in lost[0].reason and not any(isinstance(e, FollowDone) for e in events)
    assert client.follows == 3  # retried like a dropped connection, then given up


def test_a_frame_stream_reads_no_payload_it_would_refuse(tmp_path):
    stream = FollowStream(BytesStream(FRAME.pack(b"X", 0, 0, 1 << 30)), "evil")
    with pytest.raises(StreamClosed, match="garbled"):
        stream.next(1.0)


@pytest.fixture
def client(tmp_path):
    c = HostClient(make_host(tmp_path / "work"), LocalTransport("here"), Timeouts(command=20))
    yield c
    c.close()


def test_a_symlink_chain_out_of_the_job_is_refused(client, tmp_path):
    body = b"print(1)\n"
    entry = FileEntry("a/b/c/job.py", hashlib.sha256(body).hexdigest(), len(body), False,
                      str(tmp_path / "job.py"))
    (tmp_path / "job.py").write_bytes(body)
    manifest = Manifest(files=(entry,), dirs=("a", "a/b", "a/b/c"),
                        symlinks=(("a/b/c/up", "../.."), ("a/b/c/up/evil", "../../..")))
    with pytest.raises(PushError, match="under another symlink"):
        client.push("20261201-000000-0001", manifest, hold=False)
    assert not (tmp_path / "work" / "runs" / "evil").exists()
    assert not os.path.lexists(tmp_path / "work" / "runs" / "20261201-000000-0001")


def test_a_link_that_escapes_only_through_a_link_made_after_it_is_refused(client, tmp_path):
    """Issue 21: each link was checked as it was made, so one passing through a link made later escaped:
    a/b/L -> ../c/../../x reads as job/x while a/c does not exist yet; once a/c -> ../q exists, L resolves
    to the job's parent. Every link is checked again once all are made."""
    body = b"print(1)\n"
    (tmp_path / "job.py").write_bytes(body)
    entry = FileEntry("job.py", hashlib.sha256(body).hexdigest(), len(body), False, str(tmp_path / "job.py"))
    manifest = Manifest(files=(entry,), dirs=("a", "a/b", "q"),
                        symlinks=(("a/b/L", "../c/../../x"), ("a/c", "../q")))
    with pytest.raises(PushError, match="a/b/L resolves out of the job"):
        client.push("20261201-000000-0031", manifest, hold=False)
    assert not os.path.lexists(tmp_path / "work" / "runs" / "20261201-000000-0031")


def test_a_negative_size_is_refused(client, tmp_path):
    (tmp_path / "job.py").write_bytes(b"x")
    bad = Manifest(files=(FileEntry("job.py", "0" * 64, -5, False, str(tmp_path / "job.py")),), dirs=(), symlinks=())
    with pytest.raises(PushError, match="bad size -5"):
        client.push("20261201-000000-0002", bad, hold=False)


def test_a_cached_object_a_job_changed_is_fetched_again(client, tmp_path):
    m = project(tmp_path, {"job.py": b"print('original')\n"})
    first = client.push("20261201-000000-0003", m, hold=False).result
    assert first.objects == 1
    pushed = tmp_path / "work" / "runs" / "20261201-000000-0003" / "job" / "job.py"
    os.chmod(pushed, 0o644)  # what a job does to write to its input: the cached object is the same inode
    pushed.write_bytes(b"print('POISONED')\n")
    again = client.push("20261201-000000-0004", m, hold=False).result
    assert again.repaired == 1 and again.objects == 1
    fresh = tmp_path / "work" / "runs" / "20261201-000000-0004" / "job" / "job.py"
    assert fresh.read_bytes() == b"print('original')\n"
    assert "was changed after it was stored" in (tmp_path / "work" / "cache" / "objects" / "events.log").read_text()
    third = client.push("20261201-000000-0005", m, hold=False).result  # and from then on it is trusted by its stat again
    assert (third.objects, third.repaired, third.sent_bytes) == (0, 0, 0)


def test_a_rewrite_that_puts_size_mtime_and_mode_back_is_still_caught(client, tmp_path):
    """Issue 21: the cache check trusted size, mtime and mode; a job that rewrote a pushed file and put them
    back poisoned later runs. The ctime cannot be put back."""
    m = project(tmp_path, {"job.py": b"print('original')\n"})
    client.push("20261201-000000-0013", m, hold=False)
    pushed = tmp_path / "work" / "runs" / "20261201-000000-0013" / "job" / "job.py"
    st = os.stat(pushed)
    os.chmod(pushed, 0o644)
    pushed.write_bytes(b"print('POISONED')\n")  # the same size
    os.chmod(pushed, stat.S_IMODE(st.st_mode))
    os.utime(pushed, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(pushed).st_size, os.stat(pushed).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again = client.push("20261201-000000-0014", m, hold=False).result
    assert again.repaired == 1
    fresh = tmp_path / "work" / "runs" / "20261201-000000-0014" / "job" / "job.py"
    assert fresh.read_bytes() == b"print('original')\n"


def test_linking_and_clean_keep_an_unchanged_job_trusted(client, tmp_path):
    """A link (a new run folder) and an unlink (`clean`) change an object's ctime too: each notes the
    object afresh, so an unchanged job is still sent as nothing and not hashed again."""
    m = project(tmp_path, {"job.py": b"x" * 1000, "data/a.bin": os.urandom(5000)})
    client.push("20261201-000000-0021", m, hold=False)
    client.push("20261201-000000-0022", m, hold=False)
    client.clean({"remove": ["20261201-000000-0021"]})
    third = client.push("20261201-000000-0023", m, hold=False).result
    assert (third.objects, third.repaired, third.sent_bytes) == (0, 0, 0)
    log = (tmp_path / "work" / "cache" / "objects" / "events.log")
    assert not log.exists() or "changed" not in log.read_text()


def test_masking_holds_back_what_may_begin_a_secret():
    m = Masker([b"hunter2hunter2", b"abcd"])
    assert m.mask(b"x hunter2hunter2 y abcd") == b"x " + b"*" * 14 + b" y ****"
    assert m.holdback(b"log line hunter2hun") == len(b"hunter2hun")
    assert m.holdback(b"ends with ab") == 2 and m.holdback(b"nothing here") == 0
    # fed in pieces, as a follower reads a log: nothing of a value ever goes out in clear
    stream, sent = b"a hunter2hunter2 b abcd c", b""
    pending = b""
    for i in range(len(stream)):
        pending = m.mask(pending + stream[i:i + 1])
        hold = m.holdback(pending)
        sent, pending = sent + pending[:len(pending) - hold], pending[len(pending) - hold:]
    sent += m.mask(pending)
    assert sent == b"a " + b"*" * 14 + b" b **** c"


def test_the_local_transport_hands_on_only_what_a_login_would_give():
    env = host_environment({"PATH": "/bin", "HOME": "/h", "AWS_SECRET_ACCESS_KEY": "x", "WANDB_API_KEY": "y",
                            "LC_ALL": "C", "CLUSTERRUN_HOME": "/s"})
    assert env == {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C"}
