"""``kvcake master`` with ``--state-dir`` or ``--etcd-endpoints`` (called by commands/store.py).

Printed lines (for launchers and tests): ``master rpc=... directory=... http=... state_dir=...``
(durable single master); ``master standby name=... cluster=...`` at start, then
``master leader rpc=... directory=... http=... term=N`` each time this process is elected.
"""

from __future__ import annotations

import threading

from kvcake.commands._common import serve_until_signal, wait_for_signal
from kvcake.store.config import MasterConfig
from kvcake.store.ha.config import HaConfig
from kvcake.store.ha.durable import DurableMaster
from kvcake.store.ha.node import HaMaster, open_state_dir


def _where(m: DurableMaster) -> str:
    return f"rpc={m.rpc_address} directory={m.directory_address} http={m.http_address}"


def run_master(cfg: MasterConfig, ha: HaConfig) -> int:
    if ha.state_dir is not None:
        master = open_state_dir(cfg, ha)
        return serve_until_signal(
            master, "master", lambda: f"master {_where(master)} state_dir={ha.state_dir}"
        )
    stop = threading.Event()
    node = HaMaster(
        cfg,
        ha,
        on_leader=lambda m, term: print(f"master leader {_where(m)} term={term}", flush=True),
    )
    print(f"master standby name={node.name} cluster={ha.cluster}", flush=True)
    runner = threading.Thread(target=node.run, args=(stop,), name="ha-master")
    runner.start()
    try:
        wait_for_signal()
    finally:
        stop.set()
        runner.join(timeout=15)
        if runner.is_alive() or node.master is not None:  # the runner died or hangs
            node.step_down()
    return 0
