"""What a host's pull listing may make this machine do (issue 32, finding 2; runs/pull_limits.py,
docs/security.md): a real run on two `connection: local` hosts whose job sets setuid, setgid and
world-write on an output; a host that lists more than the disk holds, a file over the cap, or sends
more bytes than it listed (its listing altered where the controller reads it: what a lying host says)."""

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from clusterrun.config.inventory import Timeouts
from clusterrun.errors import PullTooLarge
from clusterrun.hosts import pull as wire
from clusterrun.hosts.client import make_connect
from clusterrun.registry.store import RunStore
from clusterrun.runs import pull_limits
from clusterrun.runs.pull import pull_run
from support import inventory_text, write_tree

JOB = textwrap.dedent("""\
    import os
    os.makedirs("outputs", exist_ok=True)
    for name, mode in (("tool", 0o6777), ("open.txt", 0o666), ("plain.txt", 0o640)):
        with open("outputs/" + name, "wb") as fh:
            fh.write(os.urandom(70000))
        os.chmod("outputs/" + name, mode)
    """)


@pytest.fixture
def ran(tmp_path, cr_home, monkeypatch):
    """(store, run id, the folder to pull to) of a run that ended, its outputs on here0."""
    monkeypatch.setenv("CLUSTERRUN_NO_RETENTION", "1")
    write_tree(tmp_path, {"job.py": JOB, "inv.yaml": inventory_text(
        [{"name": "here0", "workdir": f"{tmp_path}/w0"}], {"script": "job.py", "timeout": "60s"},
        defaults={"connection": "local"}, master={"port": "auto"})})
    done = subprocess.run([sys.executable, "-m", "clusterrun", "launch", str(tmp_path / "inv.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    store = RunStore(str(cr_home))
    return store, store.resolve("latest"), tmp_path / "got"


def test_a_pulled_output_never_keeps_setuid_setgid_nor_write_the_umask_forbids(ran):
    store, run_id, to = ran
    old = os.umask(0o022)
    try:
        pull_limits.umask.cache_clear()
        pull_run(store, run_id, make_connect(Timeouts()), paths=["outputs/"], to=str(to))
    finally:
        os.umask(old)
        pull_limits.umask.cache_clear()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (to / "outputs").iterdir()}
    assert modes == {"tool": 0o755, "open.txt": 0o644, "plain.txt": 0o640}, {k: oct(v) for k, v in modes.items()}


def lying(monkeypatch, change):
    """The host's listing as the controller reads it, altered by change(RemoteFile) -> RemoteFile."""
    real = wire.PullStream.request

    def request(self, paths, list_timeout):
        listing = real(self, paths, list_timeout)
        self.listing = wire.Listing(tuple(change(f) for f in listing.files), listing.unmatched, listing.skipped)
        return self.listing

    monkeypatch.setattr(wire.PullStream, "request", request)


def test_a_listing_larger_than_the_free_space_is_refused_before_a_byte_comes(ran, monkeypatch):
    store, run_id, to = ran
    free = __import__("shutil").disk_usage(os.path.dirname(to)).free
    lying(monkeypatch, lambda f: wire.RemoteFile(f.rel, free // 2, f.mode, f.sha256))  # three of them
    with pytest.raises(PullTooLarge, match=r"here0: pull refused: the listing asks for .* free .* nothing was fetched"):
        pull_run(store, run_id, make_connect(Timeouts()), paths=["outputs/"], to=str(to))
    assert not to.exists() or not any(to.rglob("*"))


def test_a_file_listed_over_the_cap_is_refused(ran, monkeypatch):
    store, run_id, to = ran
    lying(monkeypatch, lambda f: wire.RemoteFile(f.rel, pull_limits.MAX_FILE + 1, f.mode, f.sha256)
          if f.rel.endswith("tool") else f)
    result = pull_run(store, run_id, make_connect(Timeouts()), paths=["outputs/"], to=str(to))
    assert "more than one pulled file may be" in str(result.failed["here0"])
    assert not to.exists() or not any(to.rglob("*"))


def test_a_host_that_sends_more_than_it_listed_is_cut_off_at_that_file(ran, monkeypatch):
    store, run_id, to = ran
    lying(monkeypatch, lambda f: wire.RemoteFile(f.rel, 1000, f.mode, None) if f.rel.endswith("tool") else f)
    result = pull_run(store, run_id, make_connect(Timeouts()), paths=["outputs/tool"], to=str(to))
    assert "sent more than the 1000 bytes it listed" in str(result.failed["here0"])
    assert not any(p.is_file() and p.stat().st_size > 1000 for p in to.rglob("*"))
