"""clusterrun's host program: stdlib only, shipped to each host as one zip, unpacked
under WORKDIR/bin/host-<id>/ and run with the host's Python.

Usage (by the controller, never by hand): python WORKDIR/bin/host-<id>/ WORKDIR COMMAND [ARGS...]
RUN is a run id, or RUN/attempt-K for attempt K of a run that restarted (an attempt key).

  push/     getting a job onto this host
    receive RUN             receive the job by content hash into RUN/job (framed stdin/stdout; objects may
                            come from another host: relay.py); when asked, run job.setup (job_setup.py) and
                            hold the channel to start the run on a later message, then (an attached
                            launch) follow it there as `follow` would
  run/      running it
    start RUN               write the spec (0600) from stdin, fork a detached supervisor (supervisor.py, with
                            python_launcher.py or torchrun.py; peers.py: the supervisors among themselves;
                            hang.py: job.hang_timeout), print its state; notify.py: rank 0's host's
                            notify: commands when the run ends; every rank starts through
                            bootstrap.py (its stacks on a signal, then the entry exactly as given)
    stop RUN GRACE [WHY]    TERM the ranks' process groups, wait GRACE, KILL; idempotent
  observe/  watching it
    follow RUN OFFSETS      stream log bytes from offsets, exit records and heartbeats as frames on stdout
    status RUN              print the run's state on this host as JSON
    cat RUN PATH            print a file of the run's job folder (results such as metrics.json)
    pull RUN                list the files PATHs select in the run's folder (sizes, modes, SHA-256), then send
                            the ones asked for, each from an offset (framed stdin/stdout; a cut pull resumes)
    stacks RUN [--rank R]   every thread's stack of every rank here (py-spy, or the bootstrap's faulthandler)
    samples RUN|- S N       this host's and its ranks' CPU, memory, network, GPUs: a JSON line every S seconds
  disk/     keeping the workdir clean
    runs                    list every run folder here: status, bytes, log sizes; the cache; free space
    clean                   remove the run folders named on stdin (re-checked), collect the cache
  net/      sockets
    free-port               print a TCP port that is free on this host
    bandwidth               measure TCP bandwidth and round trips to other hosts (`check --net`; framed
                            stdin/stdout); ifaces.py: the interface the ranks use (network.ifname);
                            holder.py: who listens on a port (the push's preflight facts, and `check`'s probe);
                            claimed.py: a live run here whose rank 0 will serve a port it has not bound yet
  share/    sharing the host with other people's runs
    claims DIR...           list every claim and queue entry in these claims folders (any user's)
                            (claims.py: the folder, its files and the rule; a push claims through
                            session.py; gpus.py: nvidia-smi; waiter.py: a `--detach --wait` launch's turn)

Shared by them: wire.py (answers, framed messages, `Fail`), files.py (atomic JSON state files), paths.py
(where a run's files are), runstate.py (a run's state read back from its files), procs.py (is this pid
still the process we started?), secrets.py (masking at the source), mac.py (the MAC of the hosts' own TCP
protocols). main.py dispatches.

A rank's life never depends on the SSH channel: ranks run under a supervisor in its own session, write
to log files here, and every state change is a file written atomically. Processes are only ever
signalled by recorded pid/process group after checking they are still the ones we started (start time,
or the run id in their environment) - never by name.
"""
