"""job.hang_timeout, kept with nobody watching: when no rank of the run has written a line for that long,
the supervisors take every rank's stacks, write them down, and stop the run as hung.

What one host knows is how long its own ranks have been quiet: now minus the newest of their logs'
mtimes (torchrun's own log included, and this supervisor's start; a rank that ended counts by its last
line). A host alone decides for itself. With peers (peers.py), each peer's beats carry that figure
("quiet"); the coordinator takes the least over every host not lost (its own included; a peer that said
it is done by its last figure, which grows as time passes) and, once it reaches hang_timeout while some
rank still runs:
  1. asks every peer for its ranks' stacks ({"dump": {"reason"}}) and takes its own;
  2. when every joined peer has answered {"dumped": NODE} (or after DUMP_WAIT seconds), stops the run
     with the reason `hung: no output for 10m`: the ordinary stop, so every rank's exit record carries
     it as its stop_reason.
The stacks come before the stop, on every host: a rank whose peer died first would be somewhere else.
Each host writes what it took to RUN/stacks/hang.json (the `stacks` answer's form, observe/stacks.py;
with NCCL, each rank's last collective from the Flight Recorder's dumps under "nccl": flight.py; where
the run uses GPUs, their utilisation and memory at that moment under "gpus": share/gpus.snapshot),
a note with each rank's stack into that rank's log, a line into supervisor.log, and each rank's main
thread frames into its exit record ("stack"), from which the controller folds the root cause
(`rank 2 on a3 in slow_loader (job.py:12); ranks 0-1,3 in all_reduce`: clusterrun/stacks.py, outcome.py).
A peer that never reached the coordinator decides nothing: it cannot know what the other hosts print.
The supervisor calls `tick` from its loop (why_stop) and `exit_fields` when it writes an exit record.
"""

import os

from ..files import write_json_atomic
from ..paths import log_path, run_root, stacks_dir
from ..share.gpus import snapshot
from . import flight

HUNG = "hung: no output for %s"
DUMP_WAIT = 5.0  # the coordinator waits this long at most for the peers' stacks before it stops the run
STACK_FRAMES = 32  # of each rank's main thread, into its exit record
AUX_LOGS = ("launcher.log",)  # torchrun's own output counts as output


def duration_text(seconds):
    """600 → 10m, 5400 → 1h30m, 15 → 15s (as the inventory writes durations)."""
    seconds = int(round(seconds))
    h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
    text = ("%dh" % h if h else "") + ("%dm" % m if m else "") + ("%ds" % s if s else "")
    return text or "0s"


class HangWatch:
    """One supervisor's part of job.hang_timeout (see the module's docstring)."""

    def __init__(self, sup, timeout):
        self.sup = sup
        self.timeout = float(timeout)
        self.reason = HUNG % duration_text(self.timeout)
        self.asked_at = None  # when this host decided the run is hung (alone, or as the coordinator)
        self.stacks = {}  # rank -> its main thread's frames, once taken
        self.dumped = False
        self.collectives = {}  # rank (str) -> its last NCCL collective, from the Flight Recorder's dumps
        self.reason_given = self.reason  # the coordinator's words, on a peer
        self.errors = 0
        if sup.peer is not None:
            sup.peer.quiet = self.quiet

    @classmethod
    def of(cls, sup):
        timeout = sup.spec.get("hang_timeout")
        return cls(sup, timeout) if timeout else None

    def quiet(self, now):
        """Seconds since any rank here wrote to its log (one that ended too: its last line counts)."""
        paths = [log_path(self.sup.run_dir, int(r)) for r in self.sup.ranks]
        paths += [os.path.join(self.sup.run_dir, name) for name in AUX_LOGS]
        newest = self.sup.started
        for path in paths:
            try:
                newest = max(newest, os.path.getmtime(path))
            except OSError:
                continue
        return max(0.0, now - newest)

    def tick(self, now):
        """The reason to stop every rank here (the run is hung and its stacks are taken), or None. Nothing
        that goes wrong here may end the supervisor: its ranks, limits and records go on."""
        try:
            return self._tick(now)
        except Exception:
            self.errors += 1
            if self.errors <= 3:
                import traceback

                self.sup.log("hang watch: %s" % traceback.format_exc(limit=4).strip())
            return None

    def _tick(self, now):
        sup = self.sup
        if sup.peer is not None:  # the coordinator decides; a peer takes its stacks when asked
            if sup.peer.dump_reason and not self.dumped:
                self.dump(sup.peer.dump_reason)
                sup.peer.send({"dumped": sup.peer.node_rank})
            return None
        if self.asked_at is None:
            if not self._hung(now):
                return None
            self.asked_at = now
            if sup.coordinator is not None:
                sup.coordinator.dump(self.reason)
            self.dump(self.reason)
        if sup.coordinator is None or self._all_dumped(now):
            if sup.coordinator is not None:  # the peers first: their ranks should not die of ours first
                sup.coordinator.stop(self.reason)
            return self.reason
        return None

    def _hung(self, now):
        """No rank on any host has written a line for hang_timeout (as far as this host hears), and one
        still runs somewhere. A host whose ranks all ended counts by its last line, a lost one not at all."""
        figures = [self.quiet(now)]
        running = bool(self.sup.running_ranks())
        coordinator = self.sup.coordinator
        if coordinator is not None:
            running = running or bool(set(coordinator.running_peers()))
            for node in sorted(coordinator.expect - coordinator.lost):
                if node not in coordinator.peers:
                    if now < coordinator.join_by and node not in coordinator.done:
                        return False  # still joining: its ranks may be printing
                    continue  # never joined: it runs on its own (peers.py)
                quiet = coordinator.quiet_of(node, now)
                if quiet is None:
                    return False
                figures.append(quiet)
        return running and min(figures) >= self.timeout

    def _all_dumped(self, now):
        coordinator = self.sup.coordinator
        return set(coordinator.running_peers()) <= coordinator.dumped or now - self.asked_at >= DUMP_WAIT

    def dump(self, reason):
        """Take every running rank's stacks; write them to RUN/stacks/hang.json, the ranks' logs, the log."""
        from ..observe.stacks import collect, main_frames, write_into_log  # only a hung run pays for it

        self.dumped = True
        self.reason_given = reason
        sup = self.sup
        ranks = sup.running_ranks()
        entries = collect(sup.run_dir, {"ranks": sup.ranks}, sup.exits, ranks) if ranks else []
        # NCCL's own account (backend nccl): each rank's last collective, asked for through its pipe
        nccl = flight.evidence(run_root(sup.run_dir), ranks, sup.spec.get("node", "")) if ranks else None
        self.collectives = (nccl or {}).get("ranks") or {}
        path = os.path.join(stacks_dir(sup.run_dir), "hang.json")
        try:
            extra = dict({"nccl": nccl} if nccl else {}, **({"gpus": snapshot()} if sup.spec.get("uses_gpus") else {}))
            write_json_atomic(path, dict({"reason": reason, "ranks": entries}, **extra))
        except OSError as exc:
            sup.log("hang watch: cannot write %s: %s" % (path, exc))
        for entry in entries:
            frames = main_frames(entry)
            self.stacks[entry["rank"]] = frames[:STACK_FRAMES]
            write_into_log(sup.run_dir, entry["rank"], note(reason, entry, frames))
        how = sorted({e["via"] for e in entries if e.get("via")})
        sup.log("%s (job.hang_timeout): took the stacks of ranks %s (%s) into %s; stopping"
                % (reason, ",".join(str(r) for r in ranks) or "-", "/".join(how) or "none could be read", path))

    def exit_fields(self, rank):
        """What a rank's exit record gets once the hang watch took its stack: the stack, and why."""
        out = {"stack": self.stacks[rank], "hung": self.reason_given} if rank in self.stacks else {}
        if self.collectives.get(str(rank)):
            out["nccl"] = self.collectives[str(rank)]  # its last collective: the controller says who is behind
        return out


def note(reason, entry, frames):
    """What a hung rank's log gets: the reason and where the rank was (most recent call first)."""
    lines = ["clusterrun: %s (job.hang_timeout): the run is stopped as hung; rank %d was here "
             "(most recent call first%s):" % (reason, entry["rank"], ", read by " + entry["via"] if entry["via"] else "")]
    lines += ['  File "%s", line %d in %s' % (f["file"], f["line"], f["function"]) for f in frames]
    if not frames:
        lines.append("  (no stack: %s)" % (entry.get("error") or "nothing could be read"))
    others = len(entry.get("threads") or ()) - (1 if frames else 0)
    if others > 0 or entry.get("children"):
        lines.append("  (%d other threads, %d child processes: clusterrun stacks, or RUN/stacks/hang.json)"
                     % (max(0, others), len(entry.get("children") or ())))
    return "\n".join(lines) + "\n"
