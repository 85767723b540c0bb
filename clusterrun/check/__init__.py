"""`clusterrun check`: gather facts on every host (probe, listener), judge them with pure rules, return a
report (ui/checks.py renders it)."""
