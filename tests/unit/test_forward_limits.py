"""What any local user's programs can do to a `forward` (issue 32, finding 6; transport/forward.py,
docs/security.md): its loop works past fd 1023, holds at most MAX_CONNECTIONS at once (the rest wait in
the backlog, then go through), and running out of file descriptors delays new connections instead of
ending the forward. The forwarded port reaches an echo server here (the local transport's tunnel)."""

import contextlib
import os
import resource
import socket
import socketserver
import subprocess
import sys
import threading
import time

from clusterrun.transport import forward as fw
from clusterrun.transport.local import LocalTransport
from support import poll


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


@contextlib.contextmanager
def forwarding():
    """(the Forwarder, its local port, the notes it made) while it serves in a thread."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notes = []
    f = fw.Forwarder(LocalTransport("here").tunnel, [fw.PortSpec(server.server_address[1], 0)], on_note=notes.append)
    stopped = threading.Event()
    failed = []

    def serve():
        try:
            f.serve(stopped.is_set)
        except BaseException as exc:  # what the test asserts never happens
            failed.append(exc)

    loop = threading.Thread(target=serve, daemon=True)
    loop.start()
    try:
        yield f, f.bound[0].local, notes, failed
    finally:
        stopped.set()
        loop.join(5)
        server.shutdown()
        server.server_close()


def echo(port, payload=b"ping", timeout=5.0):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_the_loop_works_past_descriptor_1023():
    """Another user's connections (or this program's own files) push the forward's descriptors past 1023,
    where select() raises ValueError."""
    null = os.open(os.devnull, os.O_RDONLY)
    filler = []
    try:
        while True:
            fd = os.dup(null)
            filler.append(fd)
            if fd >= 1100:
                break
        with forwarding() as (f, port, notes, failed):
            assert echo(port) == b"ping" and echo(port, b"x" * 300000) == b"x" * 300000
            assert not failed, failed
    finally:
        for fd in filler + [null]:
            os.close(fd)


def test_at_most_max_connections_at_once_and_the_rest_go_through_after():
    with forwarding() as (f, port, notes, failed):
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(fw.MAX_CONNECTIONS + 6)]
        try:
            assert poll(lambda: len(f.pairs) == fw.MAX_CONNECTIONS, timeout=10)
            time.sleep(0.3)
            assert len(f.pairs) == fw.MAX_CONNECTIONS  # the other 6 wait in the backlog
            for _ in range(6):
                held.pop(0).close()
            last = held[-1]
            last.sendall(b"late")
            assert last.recv(16) == b"late"  # the last of those waiting went through once six ended
        finally:
            for s in held:
                s.close()
        assert echo(port) == b"ping" and not failed, failed


CLIENTS = """
import socket, sys
port = int(sys.argv[1])
sys.stdin.buffer.read(2)  # go: the forward's process has no descriptor left
socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3)]
for s in socks:
    s.sendall(b"two")
sys.exit(0 if all(s.recv(16) == b"two" for s in socks) else 1)
"""


def test_out_of_file_descriptors_delays_new_connections_and_the_forward_goes_on():
    # The new connections come from another process (its own descriptors), after this one has none left:
    # the forward's accept meets EMFILE for certain, not only when it is slower than the test.
    with forwarding() as (f, port, notes, failed):
        first = socket.create_connection(("127.0.0.1", port), timeout=5)
        first.sendall(b"one")
        assert first.recv(16) == b"one"
        clients = subprocess.Popen([sys.executable, "-c", CLIENTS, str(port)], stdin=subprocess.PIPE)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        holes = []
        try:
            with contextlib.suppress(OSError):
                while True:  # every descriptor under the limit taken: none left to accept into
                    holes.append(os.open(os.devnull, os.O_RDONLY))
            clients.stdin.write(b"go")
            clients.stdin.flush()
            assert poll(lambda: any("too many open files" in n for n in notes), timeout=10), notes
            first.sendall(b"still")
            assert first.recv(16) == b"still"  # what is forwarded goes on
            assert not failed, failed
        finally:
            for fd in holes:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert clients.wait(30) == 0  # once descriptors are back, those that waited go through
        clients.stdin.close()
        first.close()
        assert not failed, failed
