"""A host call's failures, translated in one place (hosts/failures.py): silence → CommandTimeout, a stream
that ended → ConnectError with the host program's stderr tail, an {"error"} answer → RemoteCommandError;
message text included, and through the callers that use it (the push's start, a pull, a one-line call)."""

import json
from dataclasses import replace

import pytest
from hostkit import make_host

from clusterrun.config.inventory import Timeouts
from clusterrun.errors import EXIT_CONNECT, CommandTimeout, ConnectError, HostError, RemoteCommandError
from clusterrun.hosts.client import HostClient
from clusterrun.hosts.failures import error_answer, exchange
from clusterrun.hosts.pull import PullStream
from clusterrun.hosts.push import HeldPush, PushResult
from clusterrun.hosts.wire import ProgramMissing
from clusterrun.transport import Completed, StreamClosed


class Stream:
    """A stream whose reads fail as told (TimeoutError, or the end: StreamClosed from read_exact)."""

    def __init__(self, *, silent=False, stderr=b""):
        self.silent, self._stderr, self.closed = silent, stderr, False

    def write(self, data, timeout=None):
        pass

    def read(self, n, timeout):
        if self.silent:
            raise TimeoutError
        return b""

    def wait(self, timeout):
        return 1

    def stderr(self):
        return self._stderr

    def close(self):
        self.closed = True


def test_silence_is_a_command_timeout_named_for_its_exchange():
    with pytest.raises(CommandTimeout) as got:
        with exchange("node1", silent="push: no answer within 30 s", lost="connection lost during the push",
                      command="python - check"):
            raise TimeoutError
    assert str(got.value) == "node1: no answer: push: no answer within 30 s"
    assert got.value.exit_code == EXIT_CONNECT and got.value.command == "python - check"
    assert got.value.__cause__ is None and got.value.__suppress_context__


def test_a_stream_that_ended_is_a_connect_error_with_the_stderr_tail():
    with pytest.raises(ConnectError) as got:
        with exchange("node1", silent="", lost="connection lost while starting"):
            raise StreamClosed("end of output")
    assert type(got.value) is ConnectError
    assert str(got.value) == "node1: unreachable: connection lost while starting: end of output"
    tail = b"Traceback ...\n" + b"x" * 600 + b"\nMemoryError\n"
    with pytest.raises(ConnectError) as got:
        with exchange("node1", silent="", lost="connection lost during the pull", stream=Stream(stderr=tail)):
            raise StreamClosed("end of output")
    said = tail.decode().strip()[-500:]
    assert str(got.value) == f"node1: unreachable: connection lost during the pull: end of output: {said}"
    assert str(got.value).endswith("x\nMemoryError")


def test_an_error_answer_is_a_remote_command_error():
    err = error_answer("node1", "no such run 2026", what="status", path="/w/runs/2026", exit_code=1)
    assert type(err) is RemoteCommandError
    assert str(err) == "node1: command failed: status: no such run 2026 (/w/runs/2026) (exit 1)"
    assert str(error_answer("node1", "cannot read m.json: No such file")) == \
        "node1: command failed: cannot read m.json: No such file"


def test_other_errors_pass_through_untouched():
    for exc in (ProgramMissing(), HostError("node1", "as it was"), KeyError("bug")):
        with pytest.raises(type(exc)) as got:
            with exchange("node1", silent="s", lost="l"):
                raise exc
        assert got.value is exc


def _held(stream):
    return HeldPush("node1", Timeouts(command=7.0), stream, PushResult(0, 0, 0, 0.0), None, {})


def test_the_start_a_pull_and_a_call_go_through_it(tmp_path):
    with pytest.raises(CommandTimeout, match=r"^node1: no answer: start: no answer within 7 s$"):
        _held(Stream(silent=True)).start({})
    with pytest.raises(ConnectError, match=r"^node1: unreachable: connection lost while starting: end of output$"):
        _held(Stream()).start({})
    with pytest.raises(ConnectError, match=r"connection lost during the pull: end of output: pull: disk gone$"):
        PullStream(Stream(stderr=b"pull: disk gone\n"), "node1", 5.0).request(["out"], list_timeout=5.0)

    class Transport:
        label = "node1"

        def run(self, argv, *, stdin=None, timeout):
            return Completed(1, json.dumps({"error": "no such run", "path": "/w/runs/x"}).encode() + b"\n", b"")

    client = HostClient(replace(make_host(tmp_path / "w"), name="node1"), Transport(), Timeouts(command=7.0))
    with pytest.raises(RemoteCommandError) as got:
        client.status("x")
    assert str(got.value) == "node1: command failed: status: no such run (/w/runs/x) (exit 1)"


def test_top_s_samples_stream_fails_in_the_same_words():
    """`top` shows a host's error as `reason: message`: a silent host is a CommandTimeout that says what it
    waited for (a bare TimeoutError would read "error: "), an ended stream a ConnectError with its tail."""
    from clusterrun.hosts.wire import Samples

    with pytest.raises(CommandTimeout) as silent:
        Samples(Stream(silent=True), "node1").next(2.0)
    assert str(silent.value) == "node1: no answer: samples: nothing within 2 s"
    with pytest.raises(ConnectError) as ended:
        Samples(Stream(stderr=b"Traceback ...\nMemoryError\n"), "node1").next(2.0)
    assert str(ended.value) == "node1: unreachable: samples ended: exit 1: Traceback ...\nMemoryError"


def test_silence_quotes_what_the_host_program_said_it_waits_for():
    """A host program that waits for a lock says so on stderr (remote/host/wire.note): a late answer's
    message carries it, so a user (and a CI log) learns why there was no answer, not only that."""
    said = Stream(silent=True, stderr=b"waiting for the claims folder's lock (/tmp/c) by pid 7 (user u: sleep)\n")
    with pytest.raises(CommandTimeout) as got:
        with exchange("node1", silent="push: no answer within 15 s", lost="connection lost", stream=said):
            raise TimeoutError
    assert str(got.value) == ("node1: no answer: push: no answer within 15 s; it said: waiting for the claims "
                              "folder's lock (/tmp/c) by pid 7 (user u: sleep)")
    with pytest.raises(CommandTimeout) as quiet:
        with exchange("node1", silent="push: no answer within 15 s", lost="connection lost", stream=Stream()):
            raise TimeoutError
    assert str(quiet.value) == "node1: no answer: push: no answer within 15 s"


def test_a_wait_for_the_cache_lock_is_said_on_stderr(tmp_path, monkeypatch, capsys):
    import fcntl
    import os

    from clusterrun.remote.host.disk import lock

    monkeypatch.setattr(lock, "SAY_AFTER", 0.05)
    os.makedirs(tmp_path / "cache")
    sweep = os.open(tmp_path / "cache" / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(sweep, fcntl.LOCK_EX)  # a sweep holds it
    try:
        assert lock.cache_lock(str(tmp_path), exclusive=False, wait=0.3) is None
        err = capsys.readouterr().err
        assert err.count("waiting for the content cache's lock") == 1 and "a cache sweep (clean)" in err
        fcntl.flock(sweep, fcntl.LOCK_UN)
        fd = lock.cache_lock(str(tmp_path), exclusive=False, wait=0.3)
        assert fd is not None and capsys.readouterr().err == ""  # no wait, nothing said
        os.close(fd)
    finally:
        os.close(sweep)
