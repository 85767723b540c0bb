"""Supervisors of one run keep its promises among themselves, with no controller alive: the first failure
on any host stops every host, and a host gone silent counts as a failure.

Node 0's supervisor is the coordinator: it listens on a free TCP port (chosen like `master: auto`); the
controller reads the port from node 0's start answer and hands it, with a per-run token, to every other
host in its 0600 spec. Each other supervisor (a peer) connects to it.

Protocol, one JSON object per line, both ways:
  coordinator → peer   {"challenge": NONCE}
  peer → coordinator   {"hello": NODE_RANK, "mac": hex(HMAC-SHA256(TOKEN, NONCE + ":" + NODE_RANK)), "done": BOOL}
  coordinator → peer   {"welcome": NODE_RANK}                   (a wrong mac: the connection is closed)
  then, both ways      {"beat": TIME}                            every second
  peer → coordinator   {"failed": {"node_rank", "rank", "exit_code", "signal"}}   its first failed rank
                       {"done": NODE_RANK}                       every rank of the peer has ended
  coordinator → peer   {"stop": {"reason": TEXT}}                stop every rank now (TERM, grace, KILL)
A peer that said hello and then nothing for host_lost seconds is lost: a failure, every host is stopped.
A peer that hears nothing from the coordinator for host_lost seconds stops its own ranks. A peer that
cannot reach the coordinator at all keeps running (a firewall may allow the ranks' ports only): it says
so in supervisor.log, and the run then has the controller's guarantees only.

It runs inside the supervisor's loop (no threads): `tick()` each 50 ms does non-blocking socket work.
"""

import hashlib
import hmac
import json
import os
import socket
import time

BEAT_EVERY = 1.0
HELLO_TIMEOUT = 5.0  # an unauthenticated connection gets this long to say hello
MAX_LINE = 1 << 16


def mac(token, nonce, node_rank):
    return hmac.new(token.encode(), ("%s:%d" % (nonce, node_rank)).encode(), hashlib.sha256).hexdigest()


class Line:
    """A socket with JSON lines in and out (non-blocking)."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.setblocking(False)
        self.buf = b""
        self.closed = False
        self.heard = time.time()

    def send(self, obj):
        try:
            self.sock.sendall((json.dumps(obj) + "\n").encode())
        except OSError:
            self.close()

    def receive(self):
        """Every whole message that has arrived; closes on EOF, an error or garbage."""
        out = []
        while not self.closed:
            try:
                data = self.sock.recv(MAX_LINE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                break
            if not data:
                self.close()
                break
            self.buf += data
            if len(self.buf) > MAX_LINE:
                self.close()
                break
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                msg = json.loads(line.decode())
            except ValueError:
                self.close()
                return out
            if isinstance(msg, dict):
                out.append(msg)
                self.heard = time.time()
        return out

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


class Coordinator:
    """Node 0's side: accepts the peers, hears their failures and heartbeats, sends the stop."""

    def __init__(self, conf, log):
        self.token = conf["token"]
        self.expect = set(conf["expect"])  # node ranks of the peers
        self.host_lost = float(conf["host_lost"])
        self.join_by = time.time() + float(conf["join_timeout"])
        self.log = log
        if conf.get("listen_fd") is not None:  # bound during the push (receive.py): its port is already known
            self.server = socket.socket(fileno=int(conf["listen_fd"]))
        else:
            self.server = socket.socket(socket.AF_INET6 if conf.get("ipv6") else socket.AF_INET, socket.SOCK_STREAM)
            self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.server.bind(("::" if conf.get("ipv6") else "", 0))
        self.server.listen(64)
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.pending = {}  # Line -> (nonce, since)
        self.peers = {}  # node_rank -> Line
        self.done, self.lost = set(), set()
        self.failure = None  # (reason) once a peer failed or was lost
        self.stop_reason = None
        self.last_beat = 0.0

    def stop(self, reason):
        """Tell every peer to stop (once)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            for line in self.peers.values():
                line.send({"stop": {"reason": reason}})

    def tick(self, now):
        self._accept(now)
        for line, (nonce, since) in list(self.pending.items()):
            self._greet(line, nonce, since, now)
        for node, line in list(self.peers.items()):
            for msg in line.receive():
                self._hear(node, msg)
            if node in self.done or node in self.lost:
                continue
            if line.closed or now - line.heard > self.host_lost:
                self.lost.add(node)
                why = "closed the connection" if line.closed else "went silent for %gs" % self.host_lost
                self.log("peer node %d %s: a host lost" % (node, why))
                self.failure = self.failure or "node %d lost (its supervisor %s)" % (node, why)
        if now - self.last_beat >= BEAT_EVERY:
            for line in self.peers.values():
                line.send({"beat": now})
            self.last_beat = now

    def _accept(self, now):
        while True:
            try:
                sock, _ = self.server.accept()
            except (BlockingIOError, InterruptedError, OSError):
                return
            line = Line(sock)
            nonce = os.urandom(16).hex()
            line.send({"challenge": nonce})
            self.pending[line] = (nonce, now)

    def _greet(self, line, nonce, since, now):
        for msg in line.receive():
            node = msg.get("hello")
            if isinstance(node, int) and node in self.expect and \
                    hmac.compare_digest(str(msg.get("mac", "")), mac(self.token, nonce, node)):
                del self.pending[line]
                old = self.peers.get(node)
                if old is not None:
                    old.close()
                self.peers[node] = line
                if msg.get("done"):  # its ranks all ended before it joined
                    self.done.add(node)
                line.send({"welcome": node})
                if self.stop_reason is not None:
                    line.send({"stop": {"reason": self.stop_reason}})
                return
            line.close()
        if line.closed or now - since > HELLO_TIMEOUT:
            line.close()
            self.pending.pop(line, None)

    def _hear(self, node, msg):
        if "failed" in msg and self.failure is None:
            f = msg["failed"] if isinstance(msg["failed"], dict) else {}
            self.failure = "rank %s on node %d failed" % (f.get("rank"), node)
        if "done" in msg:
            self.done.add(node)

    def waiting(self, now):
        """Whether peers may still run (the coordinator must stay up for them)."""
        open_peers = [n for n in self.expect if n not in self.done and n not in self.lost]
        joined = [n for n in open_peers if n in self.peers]
        return bool(joined) or (bool(open_peers) and now < self.join_by)

    def close(self):
        for line in list(self.peers.values()) + list(self.pending):
            line.close()
        self.server.close()


class Peer:
    """Another host's side: joins the coordinator, reports its failure and its end, obeys a stop."""

    def __init__(self, conf, node_rank, log):
        self.addr = (conf["addr"], int(conf["port"]))
        self.token = conf["token"]
        self.node_rank = node_rank
        self.host_lost = float(conf["host_lost"])
        self.join_by = time.time() + float(conf["join_timeout"])
        self.log = log
        self.line = None
        self.joined = False
        self.gave_up = False
        self.stop_reason = None  # what the coordinator said, or why we lost it
        self.last_try = 0.0
        self.last_beat = 0.0
        self.lost_since = None
        self.done = False  # this host's ranks have all ended: said in the hello, or sent once joined
        self.said_done = False

    def tick(self, now):
        if self.gave_up:
            return
        if self.line is None or self.line.closed:
            self._connect(now)
            return
        for msg in self.line.receive():
            self._on_message(msg)
        if self.joined and self.done and not self.said_done:
            self.line.send({"done": self.node_rank})
            self.said_done = True
        if self.joined and now - self.last_beat >= BEAT_EVERY:
            self.line.send({"beat": now})
            self.last_beat = now

    def _on_message(self, msg):
        """The coordinator's challenge (answered by the hello), its welcome, or its stop (the first one counts)."""
        if "challenge" in msg:
            self.line.send({"hello": self.node_rank, "done": self.done,
                            "mac": mac(self.token, str(msg["challenge"]), self.node_rank)})
            self.said_done = self.done
        elif "welcome" in msg:
            self.joined = True
            self.lost_since = None
        elif "stop" in msg and self.stop_reason is None:
            self.stop_reason = str((msg["stop"] or {}).get("reason") or "stopped by rank 0's host")

    def _connect(self, now):
        if self.joined:  # we had it: lost for host_lost seconds means rank 0's host is gone
            self.lost_since = self.lost_since or now
            if now - self.lost_since > self.host_lost and self.stop_reason is None:
                self.stop_reason = "lost contact with rank 0's host for %gs" % self.host_lost
                self.gave_up = True
                return
        elif now > self.join_by:
            self.log("cannot reach the coordinator at %s:%d: this run has the controller's guarantees only"
                     % self.addr)
            self.gave_up = True
            return
        if now - self.last_try < 0.5:
            return
        self.last_try = now
        try:
            sock = socket.create_connection(self.addr, timeout=1.0)
        except OSError:
            return
        self.line = Line(sock)

    def send(self, obj):
        if self.line is not None and not self.line.closed:
            self.line.send(obj)

    def finish(self, deadline):
        """Before this supervisor exits: make sure the coordinator heard that it is done (a peer that said
        hello and then vanished without a word would count as a lost host)."""
        self.done = True
        while not self.gave_up and not (self.joined and self.said_done) and time.time() < deadline:
            if self.line is None and not self.joined:
                return  # never connected: nothing half-said to take back
            self.tick(time.time())
            time.sleep(0.02)

    def close(self):
        if self.line is not None:
            self.line.close()
