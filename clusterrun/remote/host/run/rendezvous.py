"""The rendezvous watchdog on each host, in the supervisor's loop (no controller needed: detached runs too):
it names a rendezvous nobody can join within seconds, from what this host alone can see (/proc, through
observe/connecting.py, and the ranks' own arguments and MASTER_ADDR/MASTER_PORT as the bootstrap noted the
script setting them: bootstrap.py). Every rank of a multi-host run gets MASTER_ADDR:MASTER_PORT, rank 0's
host; torch's rank 0 listens there and the others connect. What goes wrong, each said once:

  elsewhere    a rank on a host other than rank 0's listens on MASTER_PORT itself: its script took rank 0
               (a rank counter on a shared folder, its own address): named LISTEN_AFTER s after it listens
  nothing      on rank 0's host, nothing listens on MASTER_PORT NOTHING_AFTER s after the ranks started,
               while a rank here keeps retrying a refused connection (the rank 0 is elsewhere)
  localhost    a rank on another host sets MASTER_ADDR to localhost itself (the DDP tutorial's line), or
               its arguments say tcp://localhost:..., nothing listens there, and it has kept retrying a
               refused connection for LOCALHOST_AFTER s
  init_method  a rank's own arguments say tcp://HOST:PORT for a HOST that is not rank 0's: at the first look
               (FIRST_LOOK s after the rank started)
Each look is LOOK_EVERY s apart, so each is named up to a second after those times.

A finding is a record {"kind", "rank", "seconds" (since the rank started), "held" (since what it names
began), "text"} in state.json's "rendezvous" list (follow's
heartbeat carries it: a controller attached, or `clusterrun logs` later, prints the text) and a line in
supervisor.log. The run goes on: a slow rank 0 may still come. The launcher torchrun has its own
rendezvous (its agent's): not watched here.
"""

import time

from ..stdlib import socket
from ..observe.connecting import listeners, retrying, sockets, table, tree
from ..paths import stacks_file

FIRST_LOOK = 2.0  # seconds after a rank started
LOOK_EVERY = 1.0
LISTEN_AFTER = 3.0
LOCALHOST_AFTER = 5.0
NOTHING_AFTER = 20.0
# Reading /proc/net/tcp is most of a look's cost (15 ms for 550 sockets on a busy host): a look a second
# while a rendezvous is most likely (the first minute), then one each LATER_EVERY, none after WATCH_FOR
BUSY_FOR = 60.0
LATER_EVERY = 10.0
WATCH_FOR = 600.0
RETRY_SEEN = 5.0  # a rank counts as retrying when it was seen holding a refused socket this recently
LOOPBACK = ("localhost", "127.0.0.1", "::1", "ip6-localhost", "0.0.0.0")
FIX = ("set `job.start: {order: rank}` if the script takes its rank from a counter, or let it use RANK / "
       "--rank")
INIT_FIX = "pass `tcp://{master_addr}:{master_port}` (or `{dist_url}`) in job.args"


def is_loopback(host):
    return host in LOOPBACK or host.startswith("127.")


def tcp_target(argv):
    """(host, port text, the argument) of the first tcp://HOST:PORT in a rank's arguments, or None."""
    for arg in argv:
        at = arg.find("tcp://")
        if at < 0:
            continue
        rest = arg[at + 6:].split("/", 1)[0].split("?", 1)[0]
        if rest.startswith("["):  # tcp://[::1]:port
            host, _, port = rest[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = rest.rpartition(":")
        if host:
            return host, port, arg
    return None


def read_env_notes(path):
    """The last MASTER_ADDR / MASTER_PORT the rank's script set itself, as the bootstrap noted them."""
    notes = {}
    try:
        with open(path) as fh:
            for line in fh:
                key, _, value = line.rstrip("\n").partition("=")
                notes[key] = value
    except OSError:
        pass
    return notes


class RendezvousWatch:
    """Looks each second at this host's ranks; `tick` returns the findings it makes (each once)."""

    def __init__(self, sup, addr, port, rank0, host):
        self.sup, self.addr, self.port, self.rank0, self.host = sup, addr, port, rank0, host
        self.first = int(sup.spec.get("node_rank") or 0) == 0
        self.said = set()  # (kind, rank)
        self.findings = []
        self.last = 0.0
        self.retry_seen = {}  # rank -> when it last held a refused socket
        self.retry_since = {}  # rank -> since when it has kept doing so
        self.listen_since = {}  # rank -> since when it listens on MASTER_PORT (not on rank 0's host)
        self.same_host = {}  # a host named in an argument -> whether it is rank 0's

    @classmethod
    def of(cls, sup):
        """A watch for this supervisor, or None: one host, torchrun, or no MASTER_ADDR:PORT to watch."""
        spec = sup.spec
        names = (spec.get("peers") or {}).get("names") or {}
        if spec.get("launcher") == "torchrun" or not names or not spec.get("ranks"):
            return None
        env = spec["ranks"][0].get("env") or {}
        try:
            port = int(env.get("MASTER_PORT") or "")
        except ValueError:
            return None
        if not env.get("MASTER_ADDR"):
            return None
        return cls(sup, env["MASTER_ADDR"], port, names.get("0") or "rank 0's host", spec.get("node") or "this host")

    def tick(self, now):
        age = now - self.sup.started
        if now - self.last < (LOOK_EVERY if age < BUSY_FOR else LATER_EVERY) or age > WATCH_FOR:
            return []
        self.last = now
        fresh = []
        listening = rows = None
        for rank, info in sorted(self._running(now)):
            age = now - info["started_at"]
            pids = tree([info["pid"]])
            if rows is None:
                rows = table()
                listening = listeners(self.port, rows)
            if retrying(pids, rows):
                if now - self.retry_seen.get(rank, -1e9) > RETRY_SEEN:
                    self.retry_since[rank] = now  # a new streak of tries
                self.retry_seen[rank] = now
            fresh += self._look(rank, pids, age, now, listening)
        if self.first and listening is not None:
            fresh += self._nothing(now, listening)
        return [f for f in fresh if f is not None]

    def _running(self, now):
        out = []
        for key, info in (self.sup.ranks or {}).items():
            rank = int(key)
            if rank not in self.sup.exits and info.get("pid") and now - info.get("started_at", now) >= FIRST_LOOK:
                out.append((rank, info))
        return out

    def _look(self, rank, pids, age, now, listening):
        found = []
        argv = next((r.get("argv") or [] for r in self.sup.spec["ranks"] if r["rank"] == rank), [])
        target = tcp_target(argv[1:])
        if target is not None and not is_loopback(target[0]) and not self._rank0_host(target[0]):
            found.append(self._say("init_method", rank, age, 0.0,
                                   "%s r%d's own arguments say %s: %s is not rank 0's host %s (%s:%d); the ranks "
                                   "wait where rank 0 is not: %s" % (self.host, rank, target[2], target[0], self.rank0,
                                                                     self.addr, self.port, INIT_FIX)))
        if not self.first:
            found += self._elsewhere(rank, pids, age, now, listening)
            found += self._localhost(rank, target, age, now)
        return found

    def _elsewhere(self, rank, pids, age, now, listening):
        if not (listening and listening & sockets(pids)):
            self.listen_since.pop(rank, None)
            return []
        since = self.listen_since.setdefault(rank, now)
        if now - since < LISTEN_AFTER - LOOK_EVERY / 2:
            return []
        return [self._say("elsewhere", rank, age, now - since,
                          "%s r%d listens on :%d on its own host, not on %s (MASTER_ADDR=%s): the script chose its "
                          "own rank or address, and its rank 0 is here; clusterrun gave rank 0 to %s (%s)"
                          % (self.host, rank, self.port, self.rank0, self.addr, self.rank0, FIX))]

    def _localhost(self, rank, target, age, now):
        notes = read_env_notes(stacks_file(self.sup.run_dir, rank) + ".env")
        set_addr = notes.get("MASTER_ADDR")
        if set_addr is not None and is_loopback(set_addr):
            port, how = notes.get("MASTER_PORT") or str(self.port), ("the script sets MASTER_ADDR=%s itself (the DDP "
                                                                    "tutorial's `os.environ['MASTER_ADDR'] = "
                                                                    "'localhost'`)" % set_addr)
            fix = "remove that line: clusterrun sets MASTER_ADDR and MASTER_PORT for every rank"
            where = set_addr
        elif target is not None and is_loopback(target[0]):
            port, how, fix, where = target[1], "its own arguments say %s" % target[2], INIT_FIX, target[0]
        else:
            return []
        if now - self.retry_seen.get(rank, -1e9) > RETRY_SEEN or self._listens_here(port) or \
                now - self.retry_since.get(rank, now) < LOCALHOST_AFTER - LOOK_EVERY / 2:
            return []
        return [self._say("localhost", rank, age, now - self.retry_since.get(rank, now),
                          "%s r%d connects to %s:%s, its own host, where nothing listens: %s; clusterrun gave rank 0 "
                          "to %s (%s:%d): %s" % (self.host, rank, where, port, how, self.rank0, self.addr, self.port,
                                                 fix))]

    def _nothing(self, now, listening):
        started = [info["started_at"] for info in (self.sup.ranks or {}).values() if info.get("started_at")]
        if listening or not started or now - min(started) < NOTHING_AFTER - LOOK_EVERY / 2:
            return []
        waiting = sorted(r for r, t in self.retry_seen.items() if now - t <= RETRY_SEEN and r not in self.sup.exits)
        if not waiting:
            return []
        who = ", ".join("r%d" % r for r in waiting)
        return [self._say("nothing", None, now - min(started), now - min(started),
                                      "nothing listens on %s:%d (MASTER_ADDR:MASTER_PORT) after %.0f s while %s %s "
                                      "keeps trying to connect: the process that took rank 0 is on another host, or "
                                      "its script listens on another address or port; clusterrun gave rank 0 to %s "
                                      "(%s)" % (self.rank0, self.port, now - min(started), self.host, who, self.rank0,
                                                FIX))]

    def _listens_here(self, port):
        try:
            return bool(listeners(int(port)))  # (another port than the one the tick's rows were read for)
        except ValueError:
            return False

    def _rank0_host(self, host):
        """Whether an argument's host is rank 0's (MASTER_ADDR, or what resolves to its address)."""
        if host == self.addr or host == self.rank0:
            return True
        if host not in self.same_host:
            self.same_host[host] = bool(_addresses(host) & _addresses(self.addr))
        return self.same_host[host]

    def _say(self, kind, rank, age, held, text):
        """A finding, once: age, seconds since the rank started; held, since what it names began."""
        if (kind, rank) in self.said:
            return None
        self.said.add((kind, rank))
        finding = {"kind": kind, "rank": rank, "seconds": round(age, 1), "held": round(held, 1), "at": time.time(),
                   "text": text}
        self.findings.append(finding)
        return finding


def _addresses(host):
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return set()
