"""A storage node (``kvcake store-server``): a :class:`Client` that contributes a DRAM segment,
plus (with ``ssd_dir``) a disk tier whose copies it makes and serves at the master's request.

The node owns its segment memory and its disk files; the master decides what lives where and
sends tasks (offload to disk, promote to memory, delete) that a poller thread executes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from kvcake.core import auth as _auth
from kvcake.core.errors import KvcakeError
from kvcake.net.httpserve import HttpThread
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig, StoreServerConfig
from kvcake.store.disk import DiskService, DiskTier
from kvcake.store.errors import ChecksumMismatch, SegmentAlreadyExists
from kvcake.store.server_http import NodeMetrics, build_app
from kvcake.store.verify import integrity_failed, report_bad
from kvcake.transfer.errors import SegmentExists
from kvcake.transfer.registry import host_identity

log = logging.getLogger(__name__)
POLL_S = 0.02
NAME_RETRY_S = 0.5  # a held name is asked for again this often (store-server --name-wait-s)
NAME_SAY_S = 5.0  # and the wait said this often


class StoreServer:
    def __init__(self, config: StoreServerConfig, auth: _auth.Authenticator | None = None):
        self.cfg = config
        self.auth = _auth.resolve(auth)  # for the master, the Transfer Engine, disk and HTTP
        self.segment_name = config.name or f"store-{config.hostname}-{os.getpid()}"
        self.disk: DiskTier | None = None
        self.disk_service: DiskService | None = None
        self.client: Client | None = None
        self.http: HttpThread | None = None
        self.metrics = NodeMetrics(self)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="store-tasks", daemon=True)

    @property
    def disk_segment(self) -> str:
        return f"{self.segment_name}.ssd"

    @property
    def http_address(self) -> str:
        return self.http.address if self.http is not None else ""

    def master_ok(self) -> bool:
        return self.client is not None and self.client.heartbeat.master_ok

    @property
    def disk_endpoint(self) -> str:
        return self.disk_service.addresses[0] if self.disk_service is not None else ""

    def start(self) -> None:
        ccfg = ClientConfig(
            master=self.cfg.master,
            hostname=self.cfg.hostname,
            segment_size=self.cfg.segment_size,
            master_call_timeout_s=self.cfg.master_call_timeout_s,
        )
        if self.cfg.ssd_dir is not None:
            self.disk = DiskTier(self.cfg.ssd_dir)
            self.disk_service = DiskService(
                self.disk, self.cfg.hostname, self.cfg.disk_port, self.auth
            )
            self.disk_service.start()
        self.client = self._connect(ccfg)
        if self.disk is not None:
            self._mount_disk(self.disk.scan())
            self.client.remount_hooks.append(lambda: self._mount_disk(self._disk_copies()))
            self._poller.start()
        if self.cfg.http_port >= 0:
            self.http = HttpThread(
                build_app(self, self.metrics),
                self.cfg.hostname,
                self.cfg.http_port,
                "node-http",
                self.auth,
            )
            self.http.start()

    def _connect(self, ccfg: ClientConfig) -> Client:
        """The node's store client. A name still held by a predecessor the master believes
        alive (one on another host than the master, whose pid it cannot check, before its
        lease expired) is asked for again until ``name_wait_s`` has passed."""
        deadline = time.monotonic() + self.cfg.name_wait_s
        said = 0.0
        while True:
            try:
                return Client(
                    ccfg, segment_name=self.segment_name, auth=self.auth or _auth.DISABLED
                )
            except (SegmentExists, SegmentAlreadyExists) as exc:
                now = time.monotonic()
                if now >= deadline:
                    raise
                if now - said >= NAME_SAY_S:
                    said = now
                    log.warning(
                        "store-server: %s; waiting for its lease to expire (%.0f s left of "
                        "--name-wait-s)", exc, deadline - now,
                    )  # fmt: skip
                time.sleep(NAME_RETRY_S)

    def _disk_copies(self) -> list[tuple[str, int, list[int]]]:
        if self.disk is None:
            return []
        sums = dict(self.disk.sums)
        return [(k, n, sums.get(k, [])) for k, n in list(self.disk.index.items())]

    def _mount_disk(self, existing: list[tuple[str, int, list[int]]]) -> None:
        assert self.client is not None and self.disk is not None
        reply = self.client.conn.call(
            P.Mount(
                self.client.id,
                self.client.host,
                self.disk_segment,
                self.cfg.ssd_quota,
                "disk",
                self.disk_endpoint,
                [(k, n) for k, n, _ in existing],
                existing_sums=[sums for _, _, sums in existing],
                host_id=host_identity(),
            )
        )
        for key in reply.rejected:
            self.disk.delete(key)

    def _poll(self) -> None:
        assert self.client is not None
        while not self._stop.wait(POLL_S):
            try:
                reply = self.client.conn.call(P.TakeTasks(self.client.id))
            except KvcakeError as exc:
                log.debug("task poll failed: %s", exc)
                continue
            sums = reply.task_sums or [[] for _ in reply.tasks]
            for (kind, key, size, offset), task_sums in zip(reply.tasks, sums, strict=True):
                ok = self._run(kind, key, size, offset, task_sums)
                self.metrics.tasks.labels(kind, str(ok).lower()).inc()
                if kind != "delete":
                    with contextlib.suppress(KvcakeError):
                        self.client.conn.call(P.TaskDone(self.client.id, kind, key, ok))

    def _run(self, kind: str, key: str, size: int, offset: int, sums: list[int]) -> bool:
        """Offload and promotion verify their source against the object's checksums from
        the master (``sums``) and carry them; a source that fails is never copied (a corrupt
        memory copy is reported and dropped, a corrupt disk file deleted)."""
        assert self.client is not None and self.disk is not None
        mem = self.client.segments[self.segment_name]
        try:
            if kind == "offload":
                try:
                    self.disk.write(key, mem[offset : offset + size], sums)
                except ChecksumMismatch:
                    integrity_failed("offload", key, self.segment_name, offset)
                    report_bad(
                        self.client.conn, self.client.id, key, self.segment_name, offset, sums
                    )
                    raise
            elif kind == "promote":
                try:
                    self.disk.read_into(key, mem[offset : offset + size], sums)
                except ChecksumMismatch:  # the file is deleted: its replica must go too
                    integrity_failed("disk", key, self.disk_segment, -1)
                    report_bad(self.client.conn, self.client.id, key, self.disk_segment, -1, sums)
                    raise
            elif kind == "delete":
                self.disk.delete(key)
            return True
        except (OSError, ValueError, KvcakeError) as exc:
            log.warning("store-server: %s of %r failed: %s", kind, key, exc)
            return False

    def stop(self) -> None:
        """Graceful: unmount (objects on this node vanish from the pool), then release memory."""
        self._stop.set()
        if self.http is not None:
            self.http.stop()
        if self._poller.is_alive():
            self._poller.join(timeout=5)
        if self.client is not None:
            if self.disk is not None:
                with contextlib.suppress(KvcakeError):
                    self.client.conn.call(P.Unmount(self.client.id, self.disk_segment))
            self.client.close()
        if self.disk_service is not None:
            self.disk_service.stop()
