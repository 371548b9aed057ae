"""Client liveness: a thread that pings the master every ``client_ttl / 3`` on its own
connection; when the master answers "unknown client" (it expired us, e.g. after a pause) the
``on_remount`` callbacks re-mount our segments."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kvcake.core.errors import KvcakeError
from kvcake.store import protocol as P
from kvcake.store.rpc import MasterConnection

log = logging.getLogger(__name__)


class Heartbeater:
    def __init__(
        self,
        conn: MasterConnection,
        client: str,
        host: str,
        ttl_s: float,
        on_remount: list[Callable[[], None]],
    ):
        self.conn = conn
        self.client = client
        self.host = host
        self.interval = max(0.02, ttl_s / 3)
        self.on_remount = on_remount
        self.master_ok = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                reply = self.conn.call(P.Heartbeat(self.client, self.host))
                self.master_ok = True
                if reply.count == 1:
                    log.warning("store client %s: master forgot us; remounting", self.client)
                    for fn in self.on_remount:
                        fn()
            except KvcakeError as exc:
                self.master_ok = False
                log.debug("heartbeat failed: %s", exc)
            except Exception:  # e.g. an OSError of a remount's directory publish
                # This thread is the client's only way back into a master that forgot it: it
                # must outlive any failure of one round (the next heartbeat tries again).
                self.master_ok = False
                log.warning("store client %s: heartbeat round failed", self.client, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.conn.close()
