"""`clusterrun sweep`: a grid of ordinary runs (grid.py) and its results, speed-ups and plots (report.py)."""
