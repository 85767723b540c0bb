"""`launch --detach --wait`: the job is pushed while the launch stands in line, and then waits on its hosts
for its turn with nobody at the controller (the laptop can close). On each host a waiter (a detached fork
of the push's receiving end, in its own session) owns the run's queue entry (share/claims.py) and the
pushed job; rank 0's host's waiter coordinates, the others join it, and together they do what an
attached controller does (launch/claiming.py): when every host says it would say yes, every host takes its
claim at once; if every one got it they start the run (run/start.py: the supervisor adopts the claim),
else they give the claims back and stand in line again.

Protocol (JSON lines over TCP, the kit's: channel/; the same guards as the supervisors' mesh: the
coordinator binds the inventory's addr on a port chosen during the push, and its door, channel/gate.py,
lets in only the run's hosts, then only a hello that proves the token the controller gave both ends):
  first the kit's handshake (channel/__init__.py), PROTOCOL "wait", CONTEXT the attempt key, NODE the
  member's node rank, DONE false:
  coordinator → member   {"challenge", "for": "wait"}
  member → coordinator   {"hello": NODE, "nonce", "done": false, "mac"}
  coordinator → member   {"welcome": NODE, "mac"}
  member → coordinator   {"status": {"ready": BOOL, "position": N}}    every PROBE_S: how its host stands
                         {"tried": ROUND, "granted": BOOL}             its answer to a try
  coordinator → member   {"beat": TIME}                               every PROBE_S
                         {"try": ROUND}       take the claim now (tentatively) and say so
                         {"release": ROUND}   not every host got it: give it back, stand in line again
                         {"go": ROUND}        every host has it: start the run
                         {"give_up": TEXT}    the wait ends (its timeout, `clusterrun stop`, a host gone)
After the welcome every line carries a MAC (channel/lines.py: Line.seal); one that fails is dropped and
logged. Anything else, or a wrong proof, drops that connection. A waiter that hears nothing from the other end
for host_lost seconds, or a member that cannot join within join_timeout, gives up. Giving up removes the
queue entry and the pushed job; the run folder keeps only waited.json (why), which `status` reports.
A waiter that dies (SIGKILL) leaves a stale queue entry (its pid is gone: ignored by everyone, removed
by the next check of its user), and the others give up after host_lost: the queue goes on without it.

Files: RUN/waiter.json {"pid", "ticks", "since", "coordinator", "standing": {"ready", "position", "holders",
"ahead"}} while it waits (`stop` sends it TERM, `status` says "waiting" with its standing), RUN/waited.json
{"gave_up": TEXT, "at"} after it gave up.
"""

import os
import shutil
import sys
import time

from ..stdlib import signal
from ..stdlib import socket
from ..channel.gate import HELLO_TIMEOUT, Gatekeeper
from ..channel.handshake import JoinError, Terms, join
from ..channel.lines import Line, ProtocolError
from ..files import read_json, write_json_atomic
from ..mac import ShortToken, check_token
from ..net import resolve_all, source_for
from ..procs import same_process, start_ticks
from ..wire import Fail

PROTOCOL = "wait"
PROBE_S = 1.0
TICK_S = 0.1
WAITER_FILE = "waiter.json"
WAITED_FILE = "waited.json"


def begin(run_dir, spec, conf, claim, start):
    """Fork the detached waiter (this process answers and ends); start(spec) starts the run when its turn
    comes. It keeps what it inherits open: the listening sockets, the run folder's receiving mark."""
    try:
        check_token(conf["token"])  # before the fork: the launch hears of it
    except ShortToken as exc:
        raise Fail("the wait's %s" % exc, "protocol") from None
    sys.stdout.flush()
    pid = os.fork()
    if pid:  # the queue entry is the waiter's from now on (this process ends: a stale owner otherwise)
        claims = claim.claims
        claims.folder.write(claims.name + ".queue", claims.entry("queue", "waiting", claims.named(), pid,
                                                                 _ticks_of(pid)))
        return pid
    code = 1
    try:
        os.setsid()
        log = os.open(os.path.join(run_dir, "waiter.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (log, 1), (log, 2)):
            os.dup2(fd, target)
        os.close(null)
        os.close(log)
        role = Coordinator if conf.get("coordinator") else Member
        code = role(run_dir, spec, conf, claim, start).run()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _ticks_of(pid):
    """A child's start ticks (its /proc entry is there as soon as fork returns)."""
    for _ in range(50):
        ticks = start_ticks(pid)
        if ticks is not None:
            return ticks
        time.sleep(0.01)
    return None


def stop(run_dir):
    """`clusterrun stop` of a run still waiting here: TERM its waiter (it gives up, and tells the others);
    True when there was one (it has ended now: given up, or started just before)."""
    info = read_json(os.path.join(run_dir, WAITER_FILE))
    if info and same_process(info.get("pid"), info.get("ticks")):
        try:
            os.kill(info["pid"], signal.SIGTERM)
        except OSError:
            return False
        deadline = time.time() + 5
        while time.time() < deadline and same_process(info.get("pid"), info.get("ticks")):
            time.sleep(0.02)
        return True
    return False


def state(run_dir):
    """What `status` says of a run that never started here: waiting (its waiter lives), gave up, or neither."""
    info = read_json(os.path.join(run_dir, WAITER_FILE))
    if info and same_process(info.get("pid"), info.get("ticks")):
        return {"waiting": True, "since": info.get("since"), "standing": info.get("standing")}
    done = read_json(os.path.join(run_dir, WAITED_FILE))
    return {"gave_up": done.get("gave_up")} if done else {}


class Waiter:
    def __init__(self, run_dir, spec, conf, claim, start):
        self.run_dir, self.spec, self.conf, self.claim, self.start = run_dir, spec, conf, claim, start
        self.terms = Terms(PROTOCOL, conf["token"], conf.get("run") or "")
        self.host_lost = float(conf.get("host_lost") or 15)
        limit = conf.get("timeout")
        self.deadline = time.time() + float(limit) if limit else None
        self.stopping = []
        self.last_probe = 0.0
        self.info = {}  # what waiter.json says (its standing rewritten when it changes: `logs -f` shows it)
        self.standing = None

    def log(self, text):
        sys.stdout.write("%s %s\n" % (time.strftime("%H:%M:%S"), text))
        sys.stdout.flush()

    def run(self):
        signal.signal(signal.SIGTERM, lambda signum, frame: self.stopping.append(signum))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        me = os.getpid()
        self.info = {"pid": me, "ticks": start_ticks(me), "since": time.time(),
                     "coordinator": bool(self.conf.get("coordinator"))}
        write_json_atomic(os.path.join(self.run_dir, WAITER_FILE), self.info)
        self.log("waiting for this host's turn (%s)" % self.claim.claims.folder.path)
        try:
            return self.loop()
        finally:
            if os.path.exists(os.path.join(self.run_dir, WAITER_FILE)):
                os.unlink(os.path.join(self.run_dir, WAITER_FILE))

    def why_stop(self, now):
        if self.stopping:
            return "stopped (`clusterrun stop`)"
        if self.deadline is not None and now > self.deadline:
            return "still busy after waiting %g s (--wait-timeout)" % float(self.conf.get("timeout"))
        return None

    def ready(self):
        return "granted" in self.probe()

    def status(self):
        verdict = self.probe()
        return {"ready": "granted" in verdict, "position": verdict.get("position", 1)}

    def probe(self):
        """This host's verdict now (nothing taken); its standing (place in line, who is in the way) kept in
        waiter.json when it changed, for `status` (`clusterrun logs -f` of a run in line shows it)."""
        verdict = self.claim.claims.admit(take=False)
        standing = {"ready": "granted" in verdict, "position": verdict.get("position", 1),
                    "holders": verdict.get("holders") or [], "ahead": verdict.get("ahead") or []}
        if standing != self.standing and os.path.exists(os.path.join(self.run_dir, WAITER_FILE)):
            self.standing = standing
            write_json_atomic(os.path.join(self.run_dir, WAITER_FILE), dict(self.info, standing=standing))
        return verdict

    def take(self):
        """Take the claim now (tentatively): True when this host said yes."""
        return "granted" in self.claim.claims.admit(take=True)

    def go(self):
        """Every host has its claim: hold it, start the run (the supervisor adopts it)."""
        claims = self.claim.claims
        claims.set_claim("held")
        claims.dequeue()
        spec = dict(self.spec)
        gpus = claims.gpus
        if gpus:  # the GPUs this host's claim took, in local-rank order (as hosts/spec.py sets them)
            text = ",".join(str(i) for i in gpus)
            spec["ranks"] = [dict(r, env=dict(r.get("env") or {}, CUDA_VISIBLE_DEVICES=text)) for r in spec["ranks"]]
            if "env" in spec:
                spec["env"] = dict(spec["env"], CUDA_VISIBLE_DEVICES=text)
        spec["claim"] = self.claim.spec_claim(spec.get("claim"))
        os.unlink(os.path.join(self.run_dir, WAITER_FILE))
        self.start(spec)
        self.claim.handed = True
        self.log("started")
        return 0

    def give_up(self, why):
        """The wait ends without a start: no queue entry, no claim, no pushed job; waited.json says why."""
        self.log("giving up: %s" % why)
        self.claim.close()
        for name in os.listdir(self.run_dir):
            if name in (WAITED_FILE, ".receiving", "waiter.log"):
                continue
            path = os.path.join(self.run_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif name != WAITER_FILE:
                os.unlink(path)
        write_json_atomic(os.path.join(self.run_dir, WAITED_FILE), {"gave_up": why, "at": time.time()})
        return 1


class Coordinator(Waiter):
    """Rank 0's host: lets the others join, runs the rounds, says go or give up."""

    def __init__(self, run_dir, spec, conf, claim, start):
        Waiter.__init__(self, run_dir, spec, conf, claim, start)
        self.server = socket.socket(fileno=int(conf["listen_fd"])) if conf.get("listen_fd") is not None else None
        self.expect = set(conf.get("expect") or [])
        self.gate = None if self.server is None else Gatekeeper(self.server, self.terms, self.expect,
                                                                resolve_all(conf.get("allow") or []), self.log)
        self.join_by = time.time() + float(conf.get("join_timeout") or 60)
        self.members, self.ready_of, self.tried = {}, {}, {}
        self.round = 0

    def loop(self):
        while True:
            now = time.time()
            why = self.why_stop(now) or self._lost(now)
            if why:
                return self._end(why)
            self._hear(now)
            if self.round:  # a round is on: wait for every host's answer
                if len(self.tried) == len(self.expect) + 1 and self._settle():
                    return self.go()
            elif now - self.last_probe >= PROBE_S:
                self.last_probe = now
                self._beat(now)
                self._maybe_round()
            time.sleep(TICK_S)

    def _end(self, why):
        for line in self.members.values():
            line.send({"give_up": why[:400]})
        self._close()
        return self.give_up(why)

    def _lost(self, now):
        for node in self.expect:
            line = self.members.get(node)
            if line is None and now > self.join_by:
                return "node %d never joined the wait" % node
            if line is not None and (line.closed or now - line.heard > self.host_lost):
                return "node %d went silent while waiting" % node
        return None

    def _beat(self, now):
        for line in self.members.values():
            line.send({"beat": now})

    def _maybe_round(self):
        """Every host would say yes now: ask every host to take its claim, this one too."""
        if len(self.members) < len(self.expect) or not all(self.ready_of.get(n) for n in self.expect):
            return
        if not self.ready():
            return
        self.round += 1
        self.tried = {}
        for line in self.members.values():
            line.send({"try": self.round})
        self.tried[0] = self.take()

    def _settle(self):
        """Every host answered the round: True to go; else everyone back in line."""
        if all(self.tried.values()):
            for line in self.members.values():
                line.send({"go": self.round})
            self._close()
            return True
        for line in self.members.values():
            line.send({"release": self.round})
        if self.tried.get(0):
            self.claim.claims.requeue()
        self.round, self.tried = 0, {}
        self.ready_of = {}
        return False

    def _close(self):
        for line in self.members.values():
            line.close()
        if self.gate is not None:
            self.gate.close_pending()
            self.server.close()

    def _hear(self, now):
        for node, line, _ in self.gate.tick() if self.gate is not None else ():
            old = self.members.get(node)
            if old is not None:
                old.close()
            self.members[node] = line
            self.log("node %d joined the wait" % node)
        for node, line in list(self.members.items()):
            try:
                self._listen(node, line)
            except (ProtocolError, KeyError, TypeError, ValueError):
                line.close()

    def _listen(self, node, line):
        for msg in line.receive():
            if isinstance(msg.get("status"), dict):
                self.ready_of[node] = msg["status"].get("ready") is True
            elif "tried" in msg:
                if self.round and msg["tried"] == self.round:
                    self.tried[node] = msg.get("granted") is True
            else:
                raise ProtocolError("an unknown message")


class Member(Waiter):
    """Any other host: joins rank 0's waiter, says how its host stands, obeys its rounds."""

    def __init__(self, run_dir, spec, conf, claim, start):
        Waiter.__init__(self, run_dir, spec, conf, claim, start)
        resolved = sorted(resolve_all([conf["addr"]]))
        self.addr = (resolved[0] if resolved else conf["addr"], int(conf["port"]))
        self.source = conf.get("bind") or ""
        self.node = int(conf["node_rank"])
        self.join_by = time.time() + float(conf.get("join_timeout") or 60)
        self.line = None
        self.taken = False

    def loop(self):
        while True:
            now = time.time()
            why = self.why_stop(now)
            if why:
                return self.give_up(why)
            if self.line is None or self.line.closed:
                if self.line is not None:
                    return self.give_up("lost the coordinating host's waiter")
                if now > self.join_by:
                    return self.give_up("could not join the coordinating host's waiter at %s:%d" % self.addr)
                self._join()
            else:
                result = self._hear(now)
                if result is not None:
                    return result
            if self.line is not None and now - self.last_probe >= PROBE_S:
                self.last_probe = now
                self.line.send({"status": self.status()})
            time.sleep(TICK_S)

    def _join(self):
        """Connect and prove the token (blocking, a few seconds at most); None on failure (tried again)."""
        local = source_for(self.source, self.addr[0]) if self.source else None
        try:
            sock = socket.create_connection(self.addr, timeout=HELLO_TIMEOUT,
                                            source_address=(local, 0) if local else None)
        except OSError:
            time.sleep(0.5)
            return
        try:
            joining = join(sock, self.terms, self.node, time.monotonic() + HELLO_TIMEOUT)
        except (OSError, JoinError):
            sock.close()
            time.sleep(0.5)
            return
        self.line = Line(sock, self.addr[0])
        self.line.seal(joining.session_key(), "J", self.log)  # every line from now on has its MAC
        self.log("joined the wait at %s:%d" % self.addr)

    def _hear(self, now):
        try:
            messages = list(self.line.receive())
        except ProtocolError:
            self.line.close()
            return None
        if now - self.line.heard > self.host_lost:
            return self.give_up("the coordinating host's waiter went silent")
        for msg in messages:
            result = self._obey(msg)
            if result is not None:
                return result
        return None

    def _obey(self, msg):
        if "try" in msg:
            self.taken = self.take()
            self.line.send({"tried": msg["try"], "granted": self.taken})
        elif "release" in msg and self.taken:
            self.claim.claims.requeue()
            self.taken = False
        elif "go" in msg and self.taken:
            self.line.close()
            return self.go()
        elif "give_up" in msg:
            return self.give_up(str(msg["give_up"])[:400])
        return None

