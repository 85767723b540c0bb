"""The host program's json, socket and signal from their C modules (remote/host/stdlib.py) behave as the
standard library's own for every call the host program makes; and the regexes it no longer loads on the
push's path (a claim's names, a Flight Recorder dump's rank, the driver's version) decide as they did."""

import json as real_json
import math
import os
import re
import signal as real_signal
import socket as real_socket
import subprocess
import sys
import threading

import pytest

from clusterrun.remote.host import stdlib
from clusterrun.remote.host.env import fingerprint
from clusterrun.remote.host.run import flight
from clusterrun.remote.host.share import claims
from clusterrun.remote.host.words import signal_name

CORPUS = [None, True, False, 0, -1, 2 ** 70, 1.5, -0.0, 1e300, 3.141592653589793, "", "plain", "é ü ß 日本",
          "\x00\x1f\"\\/\n\t", "\udc80 lone surrogate", "\U0001f600", [], {}, [1, [2, [3, {"a": None}]]],
          {"pid": 7, "argv": ["python", "-c", "x"], "env": {"K": "v=1"}, "nested": {"deep": [1.0, {"x": []}]}},
          {"1": 1, "b": 2, "a": 3}, (1, 2)]


@pytest.mark.parametrize("obj", CORPUS, ids=range(len(CORPUS)))
def test_dumps_writes_the_bytes_json_dumps_writes(obj):
    assert stdlib.json.dumps(obj) == real_json.dumps(obj)
    assert stdlib.json.loads(stdlib.json.dumps(obj)) == real_json.loads(real_json.dumps(obj))


def test_dumps_of_int_keys_nan_and_what_json_refuses():
    assert stdlib.json.dumps({1: "a", 2.5: "b", None: 0, False: 1}) == real_json.dumps({1: "a", 2.5: "b", None: 0, False: 1})
    assert stdlib.json.dumps([float("nan"), float("inf"), -float("inf")]) == "[NaN, Infinity, -Infinity]"
    for bad in (object(), {1, 2}, b"bytes", {(1, 2): 3}):
        with pytest.raises(TypeError):
            real_json.dumps(bad)
        with pytest.raises(TypeError):
            stdlib.json.dumps(bad)


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "x", null, true]}', '  [1]\n', '"\\u00e9\\ud83d\\ude00"', "1e5",
                                  "-0", "NaN", "[-Infinity]", '{"a": 1, "a": 2}', b'{"b": "\xc3\xa9"}', '\t{}\r\n'])
def test_loads_reads_what_json_loads_reads(text):
    got, want = stdlib.json.loads(text), real_json.loads(text)
    assert real_json.dumps(got) == real_json.dumps(want)
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got)


@pytest.mark.parametrize("text", ["", "   ", "{", '{"a": }', "[1,]", "[1] x", "{'a': 1}", "tru", '"\x01"', "1 2", "\n"])
def test_loads_refuses_what_json_refuses_with_a_value_error(text):
    with pytest.raises(ValueError):
        real_json.loads(text)
    with pytest.raises(ValueError):
        stdlib.json.loads(text)


def test_load_and_dump_on_files(tmp_path):
    path = tmp_path / "f.json"
    with open(path, "w") as fh:
        stdlib.json.dump({"x": [1, "y"]}, fh)
    assert path.read_text() == real_json.dumps({"x": [1, "y"]})
    with open(path) as fh:
        assert stdlib.json.load(fh) == {"x": [1, "y"]}


def test_the_lean_modules_are_the_c_ones_here():
    """CPython has the C modules: the lean versions are the ones in use (not the fallback)."""
    assert stdlib.json is not real_json and stdlib.socket is not real_socket and stdlib.signal is not real_signal


def test_a_listener_accepts_sockets_that_close_with_with():
    sock = stdlib.socket
    server = sock.socket(sock.AF_INET, sock.SOCK_STREAM)
    server.setsockopt(sock.SOL_SOCKET, sock.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(5)
    port = server.getsockname()[1]
    got = []

    def serve():
        conn, addr = server.accept()
        with conn:
            got.append((type(conn), conn.gettimeout(), addr[0], conn.recv(5)))
            conn.sendall(b"pong")

    t = threading.Thread(target=serve)
    t.start()
    with sock.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0)) as client:
        client.setsockopt(sock.IPPROTO_TCP, sock.TCP_NODELAY, 1)
        client.sendall(b"ping!")
        assert client.recv(4) == b"pong"
        assert client.gettimeout() == 5
    t.join(5)
    server.close()
    assert got == [(sock.socket, None, "127.0.0.1", b"ping!")]  # a blocking socket, as socket.accept hands out
    assert client.fileno() == -1  # closed by `with`


def test_create_connection_raises_the_last_error_and_timeouts_are_timeout():
    sock = stdlib.socket
    free = sock.socket(sock.AF_INET, sock.SOCK_STREAM)
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nobody listens there now
    with pytest.raises(ConnectionRefusedError):
        sock.create_connection(("127.0.0.1", port), timeout=2)
    listener = sock.socket(sock.AF_INET, sock.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.05)
    with pytest.raises(sock.timeout):
        listener.accept()
    listener.close()
    assert sock.timeout is real_socket.timeout
    for name in ("AF_INET", "AF_INET6", "SOCK_DGRAM", "MSG_PEEK", "SHUT_WR", "SO_ERROR", "TCP_NODELAY"):
        assert getattr(sock, name) == getattr(real_socket, name)
    assert sock.inet_ntop(sock.AF_INET6, sock.inet_pton(sock.AF_INET6, "::1")) == "::1"
    assert sock.gethostname() == real_socket.gethostname()


def test_a_name_resolves_and_connects_without_loading_the_idna_codec(tmp_path):
    """getaddrinfo of an ASCII name as bytes: the idna codec (and re, enum, unicodedata with it) stays out."""
    host = os.path.join(os.path.dirname(__file__), "..", "..", "clusterrun", "remote", "host")
    os.symlink(os.path.abspath(host), tmp_path / "clusterrun_host")
    probe = ("import sys\n"
             "from clusterrun_host.stdlib import socket\n"
             "from clusterrun_host.net import bind_address, resolve_all\n"
             "listener = bind_address('localhost')\n"
             "socket.create_connection(('localhost', listener.getsockname()[1]), timeout=5).close()\n"
             "assert '127.0.0.1' in resolve_all(['localhost', '127.0.0.1']), resolve_all(['localhost'])\n"
             "assert resolve_all(['a..b']) == set()\n"
             "print(' '.join(m for m in ('encodings.idna', 're', 'enum') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.split() == [], out.stdout + out.stderr


def test_signal_names_are_the_enums_names():
    for number in real_signal.valid_signals():
        want = real_signal.Signals(number).name if number in set(real_signal.Signals) else "signal %s" % number
        assert signal_name(int(number)) == want
    assert signal_name(9) == "SIGKILL" and signal_name(6) == "SIGABRT" and signal_name(17) == "SIGCHLD"
    assert signal_name(999) == "signal 999" and signal_name("x") == "signal x"
    assert stdlib.signal.SIGTERM == real_signal.SIGTERM and stdlib.signal.SIG_IGN == real_signal.SIG_IGN


OLD_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@pytest.mark.parametrize("text", ["r1", "a", "run-2026_12.03", "node0", "x" * 128, "x" * 129, "", "-a", ".a", "_a",
                                  "a b", "a/b", "a\n", "é", "a..b", "A9", "9", "a\x00", "Ａ"])
def test_a_claims_safe_name_is_the_old_regexes_less_its_trailing_newline(text):
    want = bool(OLD_SAFE.match(text)) and not text.endswith("\n")  # `$` let a trailing newline through
    assert claims.safe(text) is want


def test_a_flight_recorder_dumps_rank_from_its_name():
    assert flight._dump_rank("nccl_trace_rank_0") == 0
    assert flight._dump_rank("nccl_trace_rank_17") == 17
    for name in ("nccl_trace_rank_", "nccl_trace_rank_1x", "nccl_trace_pipe_rank_1", "xnccl_trace_rank_1",
                 "nccl_trace_rank_²", "nccl_trace_rank_-1", "nccl_trace_rank_1\n"):
        assert flight._dump_rank(name) is None


def test_the_drivers_version_from_proc_or_nvidia_smi(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
                    "GCC version:  gcc version 12.2.0\n")
    assert fingerprint.driver(str(proc), smi="/nonexistent") == "535.104.05"
    smi = tmp_path / "nvidia-smi"
    for printed, want in (("550.54.14\n", "550.54.14"), ("[N/A]\n", None), ("550\n", None)):
        smi.write_text("#!/bin/sh\nprintf '%s'\n" % printed.replace("\n", "\\n"))
        smi.chmod(0o755)
        proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build\n")
        assert fingerprint.driver(str(proc), smi=str(smi)) == want
    assert fingerprint.is_version("1.2") and not fingerprint.is_version("1") and not fingerprint.is_version("1..2")


def test_an_installer_killed_by_a_signal_is_named_by_the_signal():
    """env/build.py names how pip ended (issue 37's lean signal has no Signals enum: a regression crashed the
    host program mid-build and the launch read "connection lost" instead of the signal)."""
    from clusterrun.remote.host.env import build

    assert build._exit_text(-real_signal.SIGKILL) == "by signal SIGKILL"
    assert build._exit_text(-200) == "by signal 200"
    assert build._exit_text(3) == "3"


def test_the_host_modules_run_standalone_import_nothing_relative_to_the_package():
    """Modules the controller or torchrun load outside the package (hosts/client.py sends env/base.py's
    source; torchrun runs run/worker.py by path) must not import ..stdlib: they would fail with
    "attempted relative import with no known parent package" on every host."""
    from pathlib import Path

    host = Path(stdlib.__file__).parent
    for rel in ("env/base.py", "run/worker.py"):
        text = (host / rel).read_text()
        assert "from ." not in text, rel
