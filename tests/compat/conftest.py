from tests.store.conftest import master_proc, pool, procs

__all__ = ["master_proc", "pool", "procs"]
