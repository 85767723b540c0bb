"""One run, start to end: the runner (connect → push → preflight → start), the monitor (follow, first
failure, Ctrl-C, time limit, stop, outcome) and launch's preflight."""
