"""clusterrun's benchmark harness: clusterrun and the usual ways of launching, side by side (see README.md)."""
