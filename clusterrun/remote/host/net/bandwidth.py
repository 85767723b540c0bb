"""`bandwidth`: TCP bandwidth and round-trip time between this host and others (`clusterrun check --net`).

The controller runs one `bandwidth` on every host and pairs them up in rounds (check/links.py); in a
pair, one host serves (accepts on its listener) and the other connects, and both send to each other at
once (full duplex) for at most `seconds` or `bytes`, so one exchange measures the link both ways. Each
side reports what it received and how fast, and the connecting side the round trips it timed.

Every socket is bound to this host's inventory address (its `addr:`), so the traffic takes the
interface that holds it. A listener's door (the kit's, channel/gate.py) lets in only the expected peer's
address, and both ends prove they hold the per-check token the controller handed each over SSH (the
kit's handshake, channel/__init__.py), before any byte is measured; anything else is closed.

Protocol, framed JSON messages on stdin/stdout (wire.read_msg / send_msg):
  controller → {"token", "addr": this host's addr:, "dest": rank 0's addr}
  host       → {"ready": {"port", "bound", "ifname", "why", "mtu"}}     or {"error", "kind"}
  then, any number of times:
  controller → {"serve": {"pair", "peer": IP, "seconds", "bytes", "pings", "timeout"}}
             | {"connect": {"pair", "addr": IP, "port", "seconds", "bytes", "pings", "timeout"}}
  host       → {"done": {"pair", "received", "receive_s", "sent", ["rtt_ms"], ["error"]}}
  controller → {"end": true}, or end of input: the host program exits

Handshake on each pair's connection (server = the listening end): the kit's, PROTOCOL "bandwidth",
CONTEXT the pair's id, NODE 0:
  server → client  {"challenge", "for": "bandwidth"}
  client → server  {"hello": 0, "nonce", "done": false, "mac"}
  server → client  {"welcome": 0, "mac"}
then `pings` round trips of one byte (the client times them), then both send at once.
"""

import errno
import os
import select
import sys
import time

from ..stdlib import socket
from ..channel.gate import Gatekeeper
from ..channel.handshake import JoinError, Terms, join
from ..channel.lines import recv_exact
from ..mac import ShortToken
from ..wire import Fail, read_msg, send_msg
from . import ifaces, resolve_all

PROTOCOL = "bandwidth"
CHUNK = 1 << 18


class PairError(Exception):
    """This pair's exchange failed (unreachable, wrong token, cut off): reported, the others go on."""


def terms(token, pair):
    try:
        return Terms(PROTOCOL, token, pair, secret="the check's token")
    except ShortToken as exc:
        raise PairError(str(exc)) from None


def _read(sock, n, deadline):
    return recv_exact(sock, n, deadline, PairError)


def own_address(addr):
    """This host's addr: as an IP (a name is looked up here), and its family."""
    ip = addr
    if not ifaces.is_ip(addr):
        found, _, error = ifaces.lookup(addr)
        ip = ifaces.pick_address(found)
        if ip is None:
            raise Fail("addr %s does not resolve on this host: %s" % (addr, error), "addr")
    return ip, socket.AF_INET6 if ":" in ip else socket.AF_INET


def _bound(family, ip):
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((ip, 0))
    except OSError as exc:
        sock.close()
        raise Fail("cannot bind to addr %s (%s): it is not an address of this host" % (
            ip, errno.errorcode.get(exc.errno, exc)), "addr") from None
    return sock


class Bench:
    """This host's side of the measurements: a listener on its addr, the token, one pair at a time."""

    def __init__(self, conf):
        self.token = conf["token"]
        self.ip, self.family = own_address(conf["addr"])
        self.server = _bound(self.family, self.ip)
        self.server.listen(8)
        self.buf = bytearray(CHUNK)
        self.out = memoryview(os.urandom(CHUNK))  # incompressible, whatever lies between the hosts

    def ready(self, dest):
        found = ifaces.find(dest)
        return {"port": self.server.getsockname()[1], "bound": self.ip, "ifname": found.get("ifname"),
                "why": found.get("why"), "mtu": found.get("mtu")}

    def serve(self, job):
        """Let in the expected peer's connection (others are closed) once it proved the token, answer its
        pings, exchange."""
        deadline = time.monotonic() + float(job["timeout"])
        gate = Gatekeeper(self.server, terms(self.token, job["pair"]), [0], resolve_all([job["peer"]]), sealed=False)
        admitted = gate.admit_one(float(job["timeout"]))
        if admitted is None:
            why = "; ".join(gate.refusals)
            raise PairError("%s did not connect within %gs%s" % (job["peer"], float(job["timeout"]),
                                                                  (" (%s)" % why) if why else ""))
        conn = admitted[1].sock
        try:
            conn.setblocking(True)
            for _ in range(int(job.get("pings", 0))):
                conn.sendall(_read(conn, 1, deadline))
            return self.exchange(conn, job, deadline)
        finally:
            conn.close()

    def connect(self, job):
        """Connect from this host's addr to the peer's listener, prove the token, time the pings, exchange."""
        deadline = time.monotonic() + float(job["timeout"])
        conn = _bound(self.family, self.ip)
        try:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn.connect((job["addr"], int(job["port"])))
            except OSError as exc:
                raise PairError("cannot reach %s:%s: %s" % (job["addr"], job["port"], exc.strerror or exc)) from None
            self._join(conn, job, deadline)
            rtts = []
            for _ in range(int(job.get("pings", 0))):
                t0 = time.monotonic()
                conn.sendall(b"p")
                _read(conn, 1, deadline)
                rtts.append((time.monotonic() - t0) * 1000.0)
            result = self.exchange(conn, job, deadline)
            if rtts:
                result["rtt_ms"] = round(sorted(rtts)[len(rtts) // 2], 3)
            return result
        finally:
            conn.close()

    def _join(self, conn, job, deadline):
        try:
            join(conn, terms(self.token, job["pair"]), 0, deadline)
        except JoinError as exc:
            if exc.stage == "challenge":
                raise PairError("%s:%s is not clusterrun's bandwidth listener (%s)" % (job["addr"], job["port"],
                                                                                      exc)) from None
            if exc.stage == "accepted":
                raise PairError("%s did not accept the check's token (%s)" % (job["addr"], exc)) from None
            raise PairError("%s did not prove the check's token" % job["addr"]) from None

    def exchange(self, conn, job, deadline):
        """Send and receive at once until this side sent its share (bytes, or for seconds) and the other
        side's end arrived; what this side received, and in how long."""
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.monotonic()
        stop_sending = start + float(job["seconds"])
        left, sent, received, ended, last = int(job["bytes"]), 0, 0, False, start
        view = memoryview(self.buf)
        while not ended or left:
            now = time.monotonic()
            if now > deadline:
                raise PairError("the exchange did not end in time (%d bytes received)" % received)
            if left and now >= stop_sending:
                left = 0
                conn.shutdown(socket.SHUT_WR)
            readable, writable, _ = select.select([] if ended else [conn], [conn] if left else [], [], 0.2)
            n = _recv(conn, view) if readable else None
            if n == 0:
                ended, last = True, time.monotonic()
            received += n or 0
            if writable and left:
                n = _send(conn, self.out[:min(left, CHUNK)])
                sent += n
                left -= n
                if not left:
                    conn.shutdown(socket.SHUT_WR)
        return {"pair": job["pair"], "sent": sent, "received": received, "receive_s": round(last - start, 6)}


def _recv(conn, view):
    try:
        return conn.recv_into(view)
    except (BlockingIOError, InterruptedError):
        return None  # nothing after all
    except OSError as exc:
        raise PairError("the connection failed: %s" % (exc.strerror or exc)) from None


def _send(conn, data):
    try:
        return conn.send(data)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError as exc:
        raise PairError("the connection failed: %s" % (exc.strerror or exc)) from None


def cmd_bandwidth():
    stdin = sys.stdin.buffer
    conf = read_msg(stdin)
    try:
        bench = Bench(conf)
    except Fail as exc:
        send_msg({"error": str(exc), "kind": exc.kind})
        return 1
    send_msg({"ready": bench.ready(conf.get("dest") or conf["addr"])})
    while True:
        try:
            message = read_msg(stdin)
        except Fail:
            return 0  # the controller is done (end of input)
        if message.get("end"):
            return 0
        kind = "serve" if "serve" in message else "connect"
        job = message[kind]
        try:
            result = getattr(bench, kind)(job)
        except (PairError, OSError) as exc:
            result = {"pair": job.get("pair"), "error": str(exc)}
        send_msg({"done": result})
