"""clusterrun's host program: stdlib only, shipped to each host as one zip, unpacked
under WORKDIR/bin/host-<id>/ and run with the host's Python.

Usage (by the controller, never by hand): python WORKDIR/bin/host-<id>/ WORKDIR COMMAND [ARGS...]
RUN is a run id, or RUN/attempt-K for attempt K of a run that restarted (an attempt key).

Its subpackages are layers, highest first: each imports only from those below it (docs/architecture.md,
checked by tests/unit/test_layout.py).

  push/     getting a job onto this host
    receive RUN             receive the job by content hash into RUN/job (framed stdin/stdout; objects may
                            come from another host: relay.py; the preflight's facts: facts.py); when asked,
                            hold the channel (held.py): job.environment's venv (env/build.py) or the plain
                            python's fingerprint, run job.setup (job_setup.py), start the run on a
                            later message or hand it to a detached waiter, then (an attached launch) follow
                            it there as `follow` would
  run/      running it
    start RUN               write the spec (0600) from stdin, fork a detached supervisor (supervisor.py, with
                            python_launcher.py or torchrun.py; peers.py: the supervisors among themselves;
                            hang.py: job.hang_timeout; oom.py), print its state; notify.py: rank 0's host's
                            notify: commands when the run ends; every rank starts through
                            bootstrap.py (its stacks on a signal, then the entry exactly as given)
    stop RUN GRACE [WHY]    TERM the ranks' process groups, wait GRACE, KILL; idempotent
  disk/     keeping the workdir clean
    runs                    list every run folder here: status, bytes, log sizes; the cache; free space
    clean                   remove the run folders named on stdin (re-checked), collect the cache
                            (cache.py: the content cache and its index; lock.py: the cache's and a run
                            folder's locks), and the venvs no live run uses (env/usage.py)
  env/      the job's Python environment (no command of its own: steps of the held session)
                            base.py: the base interpreter described (the push's facts); build.py: the venv
                            of a key under WORKDIR/envs, built once; fingerprint.py: the stack fingerprint
  observe/  watching it (state.py: a run's state read back from its files, an orphan's end finished)
    follow RUN OFFSETS      stream log bytes from offsets, exit records and heartbeats as frames on stdout
    status RUN              print the run's state on this host as JSON
    cat RUN PATH            print a file of the run's job folder (results such as metrics.json)
    pull RUN                list the files PATHs select in the run's folder (sizes, modes, SHA-256), then send
                            the ones asked for, each from an offset (framed stdin/stdout; a cut pull resumes)
    stacks RUN [--rank R]   every thread's stack of every rank here (py-spy, or the bootstrap's faulthandler)
    samples RUN|- S N       this host's and its ranks' CPU, memory, network, GPUs: a JSON line every S seconds
  share/    sharing the host with other people's runs
    claims DIR...           list every claim and queue entry in these claims folders (any user's)
    gpu-check               the GPU preflight's raw facts (JSON request on stdin): nvidia-smi -q -x, Xid
                            lines of the kernel log, a CUDA op per GPU with the run's Python (gpu_health.py),
                            and the processes that hold the GPUs
    leftovers               the processes that hold the GPU devices, labelled by their clusterrun marker;
                            with "kill": exactly an ended run's own (leftovers.py)
                            (claims.py: its files and the rule; folder.py: the folder read and locked
                            so that other users cannot stall or fool it; a push claims through
                            session.py; gpus.py: nvidia-smi; waiter.py: a `--detach --wait` launch's turn)
  net/      sockets
    free-port               print a TCP port that is free on this host
    bandwidth               measure TCP bandwidth and round trips to other hosts (`check --net`; framed
                            stdin/stdout); ifaces.py: the interface the ranks use (network.ifname);
                            holder.py: who listens on a port (the push's preflight facts, and `check`'s probe);
                            claimed.py: a live run here whose rank 0 will serve a port it has not bound yet
  channel/  the kit the hosts' own TCP protocols are made of (the mesh, the waiters, the relay, the
            bandwidth test): JSON lines and bytes by a deadline (lines.py), one handshake that proves the
            token both ways (handshake.py), the listening end's door (gate.py)

Shared by them all: stdlib.py (json, socket and signal on their C modules: a host process starts
~16 ms sooner), wire.py (answers, framed messages, `Fail`, the one read-exactly loop), files.py
(atomic JSON state files), paths.py (where a run's files are, the one check of a run id), procs.py (is
this pid still the process we started?), secrets.py (masking at the source), mac.py (the MAC of the
hosts' own TCP protocols), shell.py (the login shell job.setup and notify run with). main.py dispatches.

A rank's life never depends on the SSH channel: ranks run under a supervisor in its own session, write
to log files here, and every state change is a file written atomically. Processes are only ever
signalled by recorded pid/process group after checking they are still the ones we started (start time,
or the run id in their environment) - never by name.
"""
