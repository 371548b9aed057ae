"""Starting and supervising a whole local cluster (``kvcake up`` / ``status`` / ``down``), also over network namespaces."""
