"""``kvcake replay``: a trace against a live cluster, and ``--compare-sim`` against the simulator."""
