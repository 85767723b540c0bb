"""`clusterrun clean` and retention: which run folders may go (policy), and going through with it on every host (run)."""
