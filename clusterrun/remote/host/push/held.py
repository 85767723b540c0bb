"""The held session: a push that asked to hold its channel (manifest "hold": receive.py) keeps it for
what comes after the objects, which saves the launch a connection round trip and an interpreter start-up
per host. End of input at any point before the start means the controller is gone or will not start:
no half-made run stays (the run folder and the objects this push added go).

Protocol (framed JSON messages, wire.read_msg/send_msg, after the push's {ok} answer):
  controller → {environment: {...}};  host → env/build.py's messages   (only where job.environment is set)
  controller → {setup: {...}};  host → job_setup.py's messages        (only where job.setup is set)
  controller → {start: spec};   host → {state}                         (run/start.py)
               {start: spec, follow: offsets} (an attached launch): then the run's follow frames on this
               channel until its end, as the `follow` command sends them (observe/follow.py)
  (--detach --wait) controller → {wait: {spec, mesh}};  host → {waiting: {pid}}: a detached waiter holds
               the job until its turn (share/waiter.py; rank 0's host bound its port in the push's first
               answer, "wait_port")
The sockets the push bound for the run (rank 0's host: the supervisors' coordinator, the waiters'
meeting point) go to the supervisor or the waiter as inherited file descriptors, named in its spec.
"""

import os

from ..run.start import start_run
from ..wire import Fail, read_msg, send_msg


def hold(push):
    """After the push's answer: the setup, then the start (or the waiter), then perhaps the follow."""
    try:
        message = read_msg(push.stdin)
        if "environment" in message:
            from ..env.build import run_environment  # here: only a job.environment loads the builder

            answer, ready = run_environment(push.workdir, push.run_dir, message["environment"], push.stdin)
            if not ready:
                push.undo()  # nothing half-done stays (the controller has the log's lines), then the answer
                send_msg(answer)
                return
            send_msg(answer)
            message = read_msg(push.stdin)
        if "setup" in message:
            from .job_setup import run_setup  # here: a job without setup never loads subprocess (5 ms a host)

            run_setup(push.workdir, push.run_dir, message["setup"], push.stdin)
            message = read_msg(push.stdin)
    except (Fail, EOFError):
        push.undo()  # the run folder, and the objects this push added to the cache
        return
    if "wait" in message and push.claim is not None:
        send_msg({"waiting": {"pid": _to_waiter(push, message["wait"])}})
        return
    spec = message["start"]
    _hand_sockets(push, spec)
    if push.claim is not None:
        spec["claim"] = push.claim.spec_claim(spec.get("claim"))  # the supervisor adopts it (run/start.py)
    follow = message.get("follow")  # an attached launch follows the run on this channel
    wake = os.pipe() if follow is not None else None
    state = start_run(push.run_dir, spec, wake=wake)
    if push.claim is not None:
        push.claim.handed = True
    send_msg({"state": state})
    if follow is not None:
        _follow(push, spec, state, follow, wake[0])


def _hand_sockets(push, spec):
    """Rank 0's host: the coordinator's socket, bound during the push, to the supervisor (a fork keeps it)."""
    if push.coordinator is not None and (spec.get("peers") or {}).get("coordinator"):
        spec["peers"]["listen_fd"] = push.coordinator.fileno()


def _to_waiter(push, request):
    """--detach --wait: a detached waiter owns the queue entry and the job from now on (share/waiter.py)."""
    from ..share import waiter

    spec, mesh = request["spec"], dict(request["mesh"])
    _hand_sockets(push, spec)
    if push.wait_server is not None:
        mesh["listen_fd"] = push.wait_server.fileno()
    pid = waiter.begin(push.run_dir, spec, mesh, push.claim, lambda s: start_run(push.run_dir, s))
    push.claim.handed = True
    return pid


def _follow(push, spec, state, offsets, wake):
    """Become the run's `follow` (observe/follow.py) on this channel: no second command, connection round
    trip or interpreter for the launch to follow what it started. What the push held goes first: the
    supervisor has its own copies of the sockets it needs."""
    from ..observe.follow import Follow, parse_offsets

    for sock in (push.coordinator, push.wait_server):
        if sock is not None:
            sock.close()
    push.coordinator = push.wait_server = None
    supervisor = (state.get("supervisor") or {}).get("pid")
    Follow(push.run_dir, spec, state, parse_offsets(offsets), False, wake=(wake, supervisor)).run()
