"""clusterrun's host program: stdlib only, shipped to each host as one zip, unpacked
under WORKDIR/bin/host-<id>/ and run with the host's Python.

Usage (by the controller, never by hand): python WORKDIR/bin/host-<id>/ WORKDIR COMMAND [ARGS...]

  receive RUN_DIR       receive the job by content hash into RUN_DIR/job (framed stdin/stdout); when
                        asked, hold the channel and start the run on a later message
  start RUN_DIR         write the spec (0600) from stdin, fork a detached supervisor (it runs the ranks in
                        their own process groups, records exits, forwards stops), print its state
  follow RUN_DIR OFFS   stream log bytes from offsets, exit records and heartbeats as frames on stdout
  status RUN_DIR        print the run's state on this host as JSON
  stop RUN_DIR GRACE    TERM the ranks' process groups, wait GRACE, KILL; idempotent
  cat RUN_DIR PATH      print a file of the run's job folder (results such as metrics.json)
  free-port             print a TCP port that is free on this host
  probe                 print facts about this host as JSON

A rank's life never depends on the SSH channel: ranks run under a supervisor in its own session, write
to log files here, and every state change is a file written atomically. Processes are only ever
signalled by recorded pid/process group after checking they are still the ones we started (start time,
or the run id in their environment) - never by name.
"""
