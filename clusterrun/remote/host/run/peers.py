"""Supervisors of one run keep its promises among themselves, with no controller alive: the first failure
on any host stops every host, and a host gone silent (either way) counts as a failure.

Node 0's supervisor is the coordinator: it listens on a free TCP port bound to its host's address (the
inventory's `addr`), chosen during the push; the controller hands the port, with a per-run token, to
every other host in its 0600 spec. Each other supervisor (a peer) connects to it from its own address.
The coordinator's door is the kit's (channel/gate.py): only connections from the run's hosts' addresses
are let in, at most MAX_PENDING unauthenticated ones at a time, each for HELLO_TIMEOUT seconds.

Protocol (version 3), one JSON object per line of at most MAX_LINE bytes (channel/lines.py), both ways:
  first the kit's handshake (channel/__init__.py), PROTOCOL "mesh", CONTEXT the attempt key, NODE the
  peer's node rank, DONE whether every rank of the peer ended before it joined:
  coordinator → peer   {"challenge", "for": "mesh"}
  peer → coordinator   {"hello": NODE, "nonce", "done": DONE, "mac"}
  coordinator → peer   {"welcome": NODE, "mac"}
     a peer acts on nothing the coordinator says before its proof checked out.
  then, both ways      {"beat": TIME}                                          every second
                       (peer → coordinator, with job.hang_timeout: {"beat": TIME, "quiet": SECONDS}, how
                       long since any running rank of the peer wrote to its log: hang.py)
  peer → coordinator   {"failed": {"rank": R, "exit_code": C, "signal": S}}   its first failed rank
                       {"done": NODE}                                          every rank of the peer ended
                       {"dumped": NODE}                                        its ranks' stacks are taken
     (a peer that failed before it joined says done false in its hello, then its failure, then done: the
     coordinator must hear of the failure before it may stop waiting for the peer)
  coordinator → peer   {"dump": {"reason": TEXT}}                              take every rank's stacks now
                                                                               (the run is hung: hang.py)
                       {"stop": {"reason": TEXT}}                              stop every rank now
Any line that is not one of these (bad JSON, too long or deep, a wrong type, a wrong proof) drops that
connection and nothing else: a parse or protocol error never reaches the supervisor; a line after the
handshake whose MAC fails is dropped alone (below).

After the handshake every line carries a MAC over its direction, a counter and the line itself, under a
key of that connection's (channel/lines.py: Line.seal): a line that fails (injected into the TCP stream,
replayed, reordered) is dropped and logged, the connection goes on.

A joined peer that says nothing for host_lost seconds is lost: a failure, every host is stopped. A
peer that hears nothing from the coordinator for host_lost seconds (rank 0's host frozen, cut off or
gone) stops its own ranks. A node that never joined by join_timeout (its supervisor cannot reach the
coordinator: a firewall that allows the ranks' ports only; or someone kept it out) is never a silent
downgrade: both ends say so in supervisor.log and in the run's state.json ("mesh"), and once no
controller follows the run (no `follow` of it has been here for host_lost seconds: observe/state.py)
the coordinator counts the node as a lost host and the peer stops its ranks (supervisor.py,
watch_mesh).

It runs inside the supervisor's loop (no threads): `tick()` each 50 ms does non-blocking socket work,
connecting included.
"""

import errno
import time

from ..stdlib import socket
from ..channel.gate import HELLO_TIMEOUT, MAX_PENDING, Gatekeeper
from ..channel.handshake import Joining, Terms, is_int
from ..channel.lines import Line, ProtocolError
from ..net import BACKLOG, bind_address, resolve_all, source_for
from ..words import how_it_ended, rank_failed

PROTOCOL = "mesh"
BEAT_EVERY = 1.0
# A peer waits this long for the coordinator's welcome (longer than the coordinator gives it for its hello:
# a coordinator taking 128 hosts' handshakes at once, on a loaded host, answers late, and a peer that gave
# up and came again only added to its work)
WELCOME_TIMEOUT = 3 * HELLO_TIMEOUT
# A joined peer whose connection closed is lost only if no new connection of its node got in within this
# (a peer that gave up on a late welcome is back in one round trip; a host that is gone never is)
REJOIN_S = 2.0
MAX_REASON = 500
MAX_QUIET = 1e9  # seconds: a quiet longer than this is not a number of ours


def terms(conf):
    return Terms(PROTOCOL, conf["token"], conf.get("run") or "")


def is_number(value, top):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= top


def failure_of(msg):
    """{"rank", "exit_code", "signal"} of a peer's failed message, type-checked; ProtocolError otherwise."""
    f = msg["failed"]
    if not isinstance(f, dict) or not all(f.get(k) is None or is_int(f.get(k)) for k in ("rank", "exit_code",
                                                                                        "signal")):
        raise ProtocolError("a failed message of the wrong shape")
    return f


class Coordinator:
    """Node 0's side: lets in the run's peers, hears their failures and heartbeats, sends the stop."""

    def __init__(self, conf, log):
        self.expect = set(conf["expect"])  # node ranks of the peers
        names = conf.get("names")
        self.names = {str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {}  # node → host
        self.host_lost = float(conf["host_lost"])
        self.join_by = time.time() + float(conf["join_timeout"])
        self.log = log
        if conf.get("listen_fd") is not None:  # bound during the push (receive.py): its port is already known
            self.server = socket.socket(fileno=int(conf["listen_fd"]))
        else:
            self.server = bind_address(conf.get("bind") or "", log)
        self.server.listen(BACKLOG)  # every peer connects at once
        self.port = self.server.getsockname()[1]
        # the run's hosts' addresses are the only sources let in
        self.gate = Gatekeeper(self.server, terms(conf), self.expect, resolve_all(conf.get("allow") or []), log,
                               max_pending=MAX_PENDING, timeout=HELLO_TIMEOUT)
        self.peers = {}  # node_rank -> Line
        self.done, self.lost = set(), set()
        self.lost_why = {}  # node_rank -> why it was lost (state.json "mesh": the controller hears it at once)
        self.closed_at = {}  # node_rank -> when its joined connection was seen closed (REJOIN_S to come back)
        self.failure = None  # (reason) once a peer failed or was lost
        self.stop_reason = None
        self.last_beat = 0.0
        self.quiet = {}  # node_rank -> (seconds quiet as it said, when it said it): hang.py
        self.dump_reason = None  # the hang watch asked every peer for its ranks' stacks
        self.dumped = set()

    @property
    def pending(self):
        """The connections that have not proven themselves yet (the gatekeeper's)."""
        return self.gate.pending

    def stop(self, reason):
        """Tell every peer to stop (once)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            for line in self.peers.values():
                line.send({"stop": {"reason": reason[:MAX_REASON]}})

    def dump(self, reason):
        """Ask every peer to take its ranks' stacks (once): the run is hung (hang.py)."""
        if self.dump_reason is None:
            self.dump_reason = reason
            for line in self.peers.values():
                line.send({"dump": {"reason": reason[:MAX_REASON]}})

    def running_peers(self):
        """Peers that joined and whose ranks may still run."""
        return [n for n in self.peers if n not in self.done and n not in self.lost]

    def quiet_of(self, node, now):
        """Seconds since any running rank of that peer wrote a line, as of now (None: it never said)."""
        said = self.quiet.get(node)
        return None if said is None else said[0] + max(0.0, now - said[1])

    def tick(self, now):
        for node, line, hello in self.gate.tick():
            self._welcome(node, line, hello)
        for node, line in list(self.peers.items()):
            try:
                self._listen(node, line)
            except Exception as exc:  # noqa: BLE001 - whatever one connection sends, only it can go
                self.gate.refuse(line.peer_ip, "%s: %s" % (type(exc).__name__, exc))
                line.close()
            self._judge(node, line, now)
        if now - self.last_beat >= BEAT_EVERY:
            for line in self.peers.values():
                line.send({"beat": now})
            self.last_beat = now

    def _judge(self, node, line, now):
        if node in self.done or node in self.lost or self.peers.get(node) is not line:
            return
        if line.closed and now - self.closed_at.setdefault(node, now) < REJOIN_S:
            return  # its node may be connecting again
        if line.closed or now - line.heard > self.host_lost:
            self.lost.add(node)
            why = "closed the connection" if line.closed else "went silent for %gs" % self.host_lost
            self.log("peer node %d %s: a host lost" % (node, why))
            self.lost_why[node] = "its supervisor %s" % why
            self.failure = self.failure or "%s lost (its supervisor %s)" % (self.name_of(node), why)

    def _welcome(self, node, line, hello):
        """A peer got in (the gatekeeper welcomed it): it replaces any connection of its node's before."""
        old = self.peers.get(node)
        if old is not None:
            old.close()
        self.peers[node] = line
        self.closed_at.pop(node, None)
        self.lost.discard(node)
        if hello["done"]:  # its ranks all ended before it joined
            self.done.add(node)
        if self.dump_reason is not None and self.stop_reason is None:
            line.send({"dump": {"reason": self.dump_reason[:MAX_REASON]}})
        if self.stop_reason is not None:
            line.send({"stop": {"reason": self.stop_reason[:MAX_REASON]}})

    def _listen(self, node, line):
        for msg in line.receive():
            if "beat" in msg:
                self._beat(node, msg)
            elif "failed" in msg:
                f = failure_of(msg)
                if self.failure is None:  # in the words `ps` uses for the same end (words.py)
                    self.failure = rank_failed(f.get("rank"), self.name_of(node),
                                               how_it_ended(f.get("exit_code"), f.get("signal")) or "failed")
            elif "done" in msg:
                if msg["done"] != node:
                    raise ProtocolError("node %d said another node is done" % node)
                self.done.add(node)
            elif "dumped" in msg:
                if msg["dumped"] != node:
                    raise ProtocolError("node %d spoke for another node's stacks" % node)
                self.dumped.add(node)
            else:
                raise ProtocolError("an unknown message")

    def _beat(self, node, msg):
        if not isinstance(msg["beat"], (int, float)) or isinstance(msg["beat"], bool):
            raise ProtocolError("a beat without a time")
        if "quiet" in msg:
            if not is_number(msg["quiet"], MAX_QUIET):
                raise ProtocolError("a beat whose quiet is not a number of seconds")
            self.quiet[node] = (float(msg["quiet"]), time.time())

    def name_of(self, node):
        """A node's host name as the inventory has it (the controller hands them over), else `node N`."""
        return self.names.get(str(node)) or "node %s" % node

    def never_joined(self, now):
        """The peers expected that never joined, once join_timeout has passed (the supervisor records them,
        and counts them as lost hosts when no controller follows the run)."""
        return [] if now < self.join_by else sorted(n for n in self.expect if n not in self.peers)

    def count_lost(self, nodes, why):
        """Nodes the supervisor counts as lost hosts without their ever having joined: a failure."""
        fresh = [n for n in nodes if n not in self.lost]
        self.lost.update(fresh)
        self.lost_why.update((n, why) for n in fresh)
        if fresh:
            self.failure = self.failure or "%s lost (%s)" % (", ".join(self.name_of(n) for n in fresh), why)

    def waiting(self, now):
        """Whether peers may still run (the coordinator must stay up for them)."""
        open_peers = [n for n in self.expect if n not in self.done and n not in self.lost]
        joined = [n for n in open_peers if n in self.peers]
        return bool(joined) or (bool(open_peers) and now < self.join_by)

    def close(self):
        for line in self.peers.values():
            line.close()
        self.gate.close_pending()
        self.server.close()


class Peer:
    """Another host's side: joins the coordinator, reports its failure and its end, obeys a stop."""

    def __init__(self, conf, node_rank, log):
        resolved = sorted(resolve_all([conf["addr"]]))  # once: a non-blocking connect must not wait on DNS
        self.addr = (resolved[0] if resolved else conf["addr"], int(conf["port"]))
        self.source = conf.get("bind") or ""  # this host's own address: where the coordinator expects us from
        self.local = None  # the address we connect from (source_for), once worked out
        self.terms = terms(conf)
        self.node_rank = node_rank
        self.host_lost = float(conf["host_lost"])
        self.join_by = time.time() + float(conf["join_timeout"])
        self.log = log
        self.line = None
        self.connecting = None  # (socket or None, since): a connect in progress (non-blocking)
        self.handshake = None  # this connection's (channel.handshake.Joining), once the hello went out
        self.line_since = 0.0  # when this connection was made (it has HELLO_TIMEOUT to get its welcome)
        self.authenticated = False  # this connection's coordinator proved the token
        self.joined = False  # some connection did: from then on its silence counts
        self.gave_up = False
        self.stop_reason = None  # what the coordinator said, or why we lost it
        self.last_try = 0.0
        self.last_beat = 0.0
        self.last_heard = None  # the coordinator's last authenticated word
        self.done = False  # this host's ranks have all ended: said in the hello, or sent once joined
        self.said_done = False
        self.failure = None  # this host's first failure, to tell the coordinator (once joined)
        self.said_failure = False
        self.quiet = None  # job.hang_timeout: a function (now) -> seconds this host's ranks have been quiet
        self.dump_reason = None  # the coordinator asked for this host's ranks' stacks (hang.py)

    def tick(self, now):
        if self.gave_up or self._silent(now):
            return
        if self.line is None or self.line.closed:
            self._connect(now)
            return
        try:  # what arrived first: a welcome waiting in the socket while this loop was late is no timeout
            for msg in self.line.receive():
                self._on_message(msg, now)
        except Exception as exc:  # garbage on the line: drop it (and reconnect), never the supervisor
            self.log("dropped the coordinator's connection: %s: %s" % (type(exc).__name__, exc))
            self._drop()
            return
        if not self.authenticated and now - self.line_since > WELCOME_TIMEOUT:
            self._drop()  # a listener that never proves itself (or never speaks): try again, or give up
            return
        if self.authenticated:
            self._say(now)

    def _say(self, now):
        """What this host owes the coordinator: its failure (before its done: the coordinator may end on
        hearing that), its done, its beat (with how long its ranks have been quiet, for the hang watch)."""
        if self.failure is not None and not self.said_failure:
            self.line.send({"failed": self.failure})
            self.said_failure = True
        if self.done and not self.said_done:
            self.line.send({"done": self.node_rank})
            self.said_done = True
        if now - self.last_beat >= BEAT_EVERY:
            beat = {"beat": now}
            if self.quiet is not None:
                beat["quiet"] = round(min(MAX_QUIET, max(0.0, self.quiet(now))), 3)
            self.line.send(beat)
            self.last_beat = now

    def _silent(self, now):
        """Rank 0's host said nothing for host_lost seconds since we joined (frozen, cut off, gone): stop."""
        if not self.joined or now - self.last_heard <= self.host_lost or self.stop_reason is not None:
            return False
        self.stop_reason = "lost contact with rank 0's host (silent for %gs)" % self.host_lost
        self.log("stopping: " + self.stop_reason)
        self.gave_up = True
        self._drop()
        return True

    def _drop(self):
        if self.line is not None:
            self.line.close()
        self.line = None
        self.authenticated = False

    def _on_message(self, msg, now):
        """The coordinator's challenge (answered by the hello), its welcome (checked), then its beats and stop."""
        if self.authenticated:
            self._on_word(msg, now)
        elif self.handshake is None:  # the challenge
            self.handshake = Joining(self.terms, self.node_rank)
            # a failure not yet told goes first, once joined: a hello saying done would let the coordinator
            # stop waiting for this host before it heard of the failure
            done = self.done and (self.failure is None or self.said_failure)
            self.line.send(self.handshake.hello(msg, done))
            self.said_done = done
        else:  # the welcome
            self.handshake.check_welcome(msg)
            self.line.seal(self.handshake.session_key(), "J", self.log)  # every line from now on has its MAC
            self.authenticated = self.joined = True
            self.last_heard = now

    def _on_word(self, msg, now):
        if "beat" in msg:
            if not isinstance(msg["beat"], (int, float)) or isinstance(msg["beat"], bool):
                raise ProtocolError("a beat without a time")
        elif "stop" in msg:
            stop = msg["stop"]
            if not isinstance(stop, dict) or not isinstance(stop.get("reason", ""), str):
                raise ProtocolError("a stop of the wrong shape")
            if self.stop_reason is None:
                self.stop_reason = (stop.get("reason") or "stopped by rank 0's host")[:MAX_REASON]
        elif "dump" in msg:
            dump = msg["dump"]
            if not isinstance(dump, dict) or not isinstance(dump.get("reason"), str):
                raise ProtocolError("a dump of the wrong shape")
            if self.dump_reason is None:
                self.dump_reason = dump["reason"][:MAX_REASON]
        else:
            raise ProtocolError("an unknown message")
        self.last_heard = now

    def _connect(self, now):
        if not self.joined and now > self.join_by:
            self.log("cannot reach the coordinator at %s:%d within join_timeout: the run has the "
                     "controller's guarantees only while a controller follows it" % self.addr)
            self.gave_up = True
            return
        if self.connecting is not None:
            self._finish_connect(now)
        elif now - self.last_try >= 0.5:
            self.last_try = now
            self.connecting = (self._start_connect(), now)

    def _start_connect(self):
        sock = socket.socket(socket.AF_INET6 if ":" in self.addr[0] else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        if self.local is None:
            self.local = source_for(self.source, self.addr[0]) if self.source else ""
        local = self.local
        try:
            if local:  # from our own address: the one the coordinator lets in
                sock.bind((local, 0))
            err = sock.connect_ex(self.addr)
        except OSError:
            sock.close()
            return None
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            sock.close()
            return None
        return sock

    def _finish_connect(self, now):
        sock, since = self.connecting
        if sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            try:
                sock.getpeername()
            except OSError:  # still connecting
                if now - since <= 1.0:
                    return
            else:
                self.connecting = None
                self.line = Line(sock, self.addr[0])
                self.line_since = now
                self.handshake = None
                self.authenticated = False
                return
        if sock is not None:
            sock.close()
        self.connecting = None

    def unreached(self):
        """The coordinator never let this peer in, and join_timeout has passed: it no longer tries."""
        return self.gave_up and not self.joined

    def send(self, obj):
        if self.line is not None and not self.line.closed and self.authenticated:
            self.line.send(obj)

    def report(self, failure):
        """This host's first failure: told now if joined, else as soon as it is (before it says done)."""
        if self.failure is None:
            self.failure = failure

    def finish(self, deadline):
        """Before this supervisor exits: make sure the coordinator heard that it is done, and of its failure
        first (a peer that said hello and then vanished without a word would count as a lost host). Also
        when it never connected (its ranks failed within its first tick): it joins now, so rank 0's host
        hears of the failure at once instead of waiting out join_timeout. Bounded by deadline."""
        self.done = True
        while not self.gave_up and not (self.authenticated and self.said_done) and time.time() < deadline:
            self.tick(time.time())
            time.sleep(0.02)

    def close(self):
        self._drop()
        if self.connecting is not None and self.connecting[0] is not None:
            self.connecting[0].close()
