"""The store client: put/get KV objects in the pool (Pythonic: exceptions, any buffer).

Values are anything with the buffer protocol (bytes, bytearray, memoryview, numpy arrays,
contiguous torch CPU tensors). Writes are two-phase (master put_start -> bytes written into each
replica through the Transfer Engine -> put_end; put_revoke on failure). Reads pick local memory,
then same-host memory, then remote memory, then the disk tier, and fail with
:class:`LeaseExpired` rather than return bytes read after their read lease ran out.

Batch calls return one entry per key: ``None``/a value on success or the :class:`StoreError`
for that key (they raise only for whole-call problems such as mismatched lengths).
Threading: a Client may be shared by threads (its master connection is locked per call).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvcake.core import auth as _auth
from kvcake.core.clocks import boottime
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.via import Via
from kvcake.store import protocol as P
from kvcake.store.config import ClientConfig
from kvcake.store.errors import (
    SegmentAlreadyExists,
    TransferFailed,
    error_for,
)
from kvcake.store.fences import write_deadline
from kvcake.store.ha.resolve import FailoverConnection
from kvcake.store.liveness import DEFAULT_CLIENT_TTL_S, Heartbeater, call_deadline_s
from kvcake.store.memtune import tune_malloc
from kvcake.store.netreads import Scratch
from kvcake.store.owners import dead_here
from kvcake.store.puts import Result, WritePath, raise_if
from kvcake.store.reads import ReadPath
from kvcake.store.rpc import MasterConnection
from kvcake.store.staging import Staging
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.errors import DirectoryUnreachable, TransferError
from kvcake.transfer.metadata import DirectoryClient
from kvcake.transfer.registry import host_identity

_T = TypeVar("_T")
FAILOVER_S = 30.0  # as long as FailoverConnection waits for a new leader
log = logging.getLogger(__name__)
REMOUNT_ROUNDS = 5  # a remount repeats while failovers keep moving the master under it


class Client:
    """A store client: reads through its :class:`ReadPath` part (``self.reads``), puts through
    its :class:`WritePath` part (``self.writes``), whose public methods are this client's
    (:class:`~kvcake.core.via.Via`); membership, replicas and removal here."""

    get = Via("reads", ReadPath.get)
    batch_get = Via("reads", ReadPath.batch_get)
    get_into = Via("reads", ReadPath.get_into)
    batch_get_into = Via("reads", ReadPath.batch_get_into)
    batch_get_into_ranges = Via("reads", ReadPath.batch_get_into_ranges)
    get_size = Via("reads", ReadPath.get_size)
    get_replica_desc = Via("reads", ReadPath.get_replica_desc)
    is_exist = Via("reads", ReadPath.is_exist)
    batch_is_exist = Via("reads", ReadPath.batch_is_exist)
    put = Via("writes", WritePath.put)
    upsert = Via("writes", WritePath.upsert)
    put_from = Via("writes", WritePath.put_from)
    batch_put = Via("writes", WritePath.batch_put)
    batch_upsert = Via("writes", WritePath.batch_upsert)

    def __init__(
        self,
        config: ClientConfig | None = None,
        segment_name: str = "",
        auth: _auth.Authenticator | None = None,
        transfer_port: int = 0,
        **kw: Any,
    ):
        """``auth``: the cluster's shared secret (None: the environment's, if any);
        ``transfer_port``: the port this client's Transfer Engine listens on (0: the OS picks)."""

        self.cfg = config or ClientConfig(**kw)
        self.auth = _auth.resolve(auth) or _auth.DISABLED
        if self.cfg.tune_malloc:
            tune_malloc()
        self.conn = _connection(
            self.cfg.master,
            self._call_deadline(DEFAULT_CLIENT_TTL_S),
            self.cfg.busy_poll_us,
            self.cfg.rpc_retries,
            auth=self.auth,
        )
        try:
            hello = self.conn.call(P.Heartbeat("", self.cfg.hostname))
            self.client_ttl_s = hello.client_ttl_ms / 1000 or DEFAULT_CLIENT_TTL_S
            self.conn.set_timeout(self._call_deadline(self.client_ttl_s))
            self.engine = self._start_engine(hello.directory, transfer_port)
        except BaseException:
            self.conn.close()
            raise
        self.id = self.engine.owner
        self.host = self.cfg.hostname
        self.segments: dict[str, memoryview] = {}
        self.remount_hooks: list[Callable[[], None]] = [self._remount]
        self._closed = True
        try:
            self._make_parts()
            self.conn.call(P.Heartbeat(self.id, self.host))
            if self.cfg.segment_size:
                self._own_segment(segment_name)
        except BaseException:
            self.segments.clear()
            self.engine.close()  # releases the shm segment it may have created
            self.conn.close()
            raise
        self.heartbeat = self._heartbeater(hello.client_ttl_ms / 1000)
        self.heartbeat.start()
        self._closed = False

    def _start_engine(self, directory: str, transfer_port: int) -> TransferEngine:
        if not directory:
            raise StoreError("the master hosts no Transfer Engine directory", -1)
        engine = TransferEngine(  # listens where peers reach this host (not only loopback)
            directory,
            self.cfg.hostname,
            (self.cfg.hostname,),
            protocol=self.cfg.protocol,
            auth=self.auth,
            listen_port=transfer_port,
        )
        if engine.directory is not None:
            engine.directory.set_timeout(self._call_deadline(self.client_ttl_s))
        return engine

    def _make_parts(self) -> None:
        """The staging buffer, and the read and write paths that share it."""
        staging = f"staging-{self.id.replace('/', '-')}"
        self.staging = self._through_failover(lambda: Staging(self.engine, staging))
        self.reads = ReadPath(
            self.conn,
            self.id,
            self.host,
            self.segments,
            self.engine,
            self.staging,
            Scratch(),
            self.cfg.verify,
        )
        self.writes = WritePath(
            self.conn,
            self.id,
            self.cfg,
            self.segments,
            self.engine,
            self.staging,
            lambda: _connection(
                self.cfg.master, self._call_deadline(self.client_ttl_s), auth=self.auth
            ),
        )

    def _own_segment(self, segment_name: str) -> None:
        """Allocate, publish and mount this client's memory segment (``config.segment_size``)."""
        name = segment_name or f"seg-{self.id.replace('/', '-')}"
        # "{port}": the port this client's Transfer Engine listens on (Mooncake names a
        # client's segment "host:port" after its engine's port).
        name = name.replace("{port}", self.engine.addresses[0].rsplit(":", 1)[1])
        size = self.cfg.segment_size
        if segment_name:  # (a default name carries this client's id: never held)
            self._report_dead_holder(name)
        self.segments[name] = self._through_failover(
            lambda: self.engine.allocate_segment(name, size)
        )
        self._mount(name)

    def _heartbeater(self, ttl_s: float) -> Heartbeater:
        """Heartbeats on a connection of their own (no retries: the next beat is the retry)."""
        deadline = self._call_deadline(self.client_ttl_s)
        hb_conn = _connection(self.cfg.master, deadline, retries=0, auth=self.auth)
        return Heartbeater(
            hb_conn,
            self.id,
            self.host,
            ttl_s,
            self.remount_hooks,
            self._directory_in_use,
            on_forgotten=[self.engine.cut_inbound],
            fences=self.engine.server.fences,
        )

    @property
    def disk_reads(self) -> int:
        """Values read from a node's disk tier over its disk service (a stat)."""
        return self.reads.replicas.disk_reads

    @property
    def file_reads(self) -> int:
        """Values read from the file tier (a stat)."""
        return self.reads.replicas.file_reads

    def _call_deadline(self, client_ttl_s: float) -> float:
        """Each try of a master call ends after this (client.master_call_timeout_s)."""
        cfg = self.cfg
        return call_deadline_s(client_ttl_s, cfg.rpc_timeout_s, cfg.master_call_timeout_s)

    # --- segments -----------------------------------------------------------------------------

    def _report_dead_holder(self, name: str) -> None:
        """A node restarted at once after a SIGKILL finds its name still held by its dead
        predecessor. A master on another host cannot check that pid; this process can, on its
        own host: it tells the master (``P.OwnerGone``; store/owners.py), which then frees the
        name at once instead of after the predecessor's lease (StoreServer waits for that).
        Here the directory names the holder; after a leader change it may not (the new leader's
        directory starts empty), and the refused mount names it instead (:meth:`_mount`)."""
        directory = self.engine.directory
        if directory is None:
            return
        try:
            holder = directory.lookup(name)
        except TransferError:  # no holder (the usual case), or no directory to ask
            return
        self._report_if_gone(name, holder.owner, holder.host_id)

    def _report_if_gone(self, name: str, owner: str, owner_host: str) -> bool:
        """Tell the master ``owner`` is gone if it ran on this host and its pid is; whether
        the master believed it."""
        if not dead_here(owner, owner_host, self.id):
            return False
        try:
            self.conn.call(P.OwnerGone(self.id, host_identity(), owner))
        except StoreError:  # not believed: the lease's expiry frees it
            return False
        log.warning("store client %s: %r was held by %s, gone", self.id, name, owner)
        return True

    def _mount(self, name: str) -> None:
        cap = self.segments[name].nbytes

        def mount() -> P.Mount:
            return P.Mount(self.id, self.host, name, cap, host_id=host_identity())

        try:
            reply = self.conn.call(mount())
        except SegmentAlreadyExists as exc:
            if exc.holder is None or not self._report_if_gone(name, *exc.holder):
                raise
            # The master believed it: the name is free now. (A new request: the refused one's
            # id would be answered from the master's dedup table.)
            reply = self.conn.call(mount())
        self.engine.server.fences.floor(reply.floors)  # before any stale write lands (fences.py)

    def _remount(self) -> None:
        """Publish our segments in the leader's directory, then mount them. A failover in
        between makes the mount land on the *next* leader (the connection follows it), which
        then knows us, so it never asks us to remount, while our segments sit in the dead
        leader's directory: readers get "unknown segment" for every object of ours. So the
        directory is asked again after the mounts, and the whole step repeats until the
        mounts and the publish went to the same master."""
        for _ in range(REMOUNT_ROUNDS):
            published = self._follow_directory()
            if self.engine.directory is not None:  # the master dropped us from the directory
                for name in self.engine.local_segments():
                    self.engine.directory.publish(self.engine.segment_info(name))
            for name in self.segments:
                self._mount(name)
            if self._directory_address() == published:
                return
            log.warning("store client %s: the master changed while remounting; again", self.id)

    def _through_failover(self, publish: Callable[[], _T]) -> _T:
        """Run a step that publishes to the segment directory; if the directory's master died
        (HA), follow the new leader's directory and retry (each step rolls back on failure,
        so a retry never finds half of it done)."""
        deadline = time.monotonic() + FAILOVER_S
        while True:
            try:
                return publish()
            except DirectoryUnreachable:
                if not self.cfg.master.startswith("etcd://") or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                self._follow_directory()

    def _directory_in_use(self) -> str:
        directory = self.engine.directory
        return directory.address if directory is not None else ""

    def _directory_address(self) -> str:
        """The Transfer Engine directory of the master our connection reaches now."""
        return self.conn.call(P.Heartbeat("", self.host)).directory

    def _follow_directory(self) -> str:
        """After a master failover (store/ha) the Transfer Engine directory lives elsewhere;
        returns the address followed."""
        where = self._directory_address()
        old = self.engine.directory
        if old is not None and where and where != old.address:
            self.engine.directory = self.engine.registry.directory = DirectoryClient(
                where, self._call_deadline(self.client_ttl_s), auth=self.auth
            )
            old.close()
        return where

    # --- replicas -----------------------------------------------------------------------------

    def copy_replica(self, key: str, targets: Sequence[str]) -> None:
        """Copy ``key`` onto each memory segment of ``targets`` (store/replica_ops.py): the new
        replicas are readable once this returns; on any failure none of them is."""
        value = memoryview(self.get(key))
        sent = boottime()
        reply = self.conn.call(P.ReplicaCopyStart(self.id, key, list(targets)))
        if reply.code:
            raise error_for(reply.code, f"{key!r}: {reply.message}")
        failed: dict[str, Exception] = {}
        deadline = write_deadline(sent, reply.write_lease_ms)
        try:
            writes = [(key, value, rep) for rep in reply.results[0].replicas]
            failed = self.writes.write_all(writes, None, deadline)
        finally:
            end = self.conn.call(P.ReplicaCopyEnd(self.id, key, not failed))
        if failed:
            raise TransferFailed(f"{key!r}: copy failed: {failed[key]}")
        if end.code:
            raise error_for(end.code, f"{key!r}: {end.message}")

    def drop_replica(self, key: str, segment: str) -> None:
        """Forget the replica of ``key`` on ``segment`` (another readable one must remain)."""
        reply = self.conn.call(P.ReplicaDrop(self.id, key, segment))
        if reply.code:
            raise error_for(reply.code, f"{key!r}: {reply.message}")

    def move_replica(self, key: str, source: str, target: str) -> None:
        """Copy ``key``'s replica to ``target``, then drop the one on ``source``."""
        self.copy_replica(key, [target])
        self.drop_replica(key, source)

    # --- removal ------------------------------------------------------------------------------

    def remove(self, key: str, force: bool = False) -> None:
        """Raises ObjectNotFound, ObjectHasLease (someone is reading it) unless ``force``."""
        raise_if(self.batch_remove([key], force)[0])

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[Result]:
        reply = self.conn.call(P.Remove(self.id, list(keys), force))
        return [error_for(r.code, r.message) if r.code else None for r in reply.results]

    def remove_all(self, force: bool = False, pattern: str = "") -> int:
        """Remove every object, or those matching a prefix or glob ``pattern`` (docs/store.md,
        "Patterns"); leased ones are skipped unless ``force``."""
        return self.conn.call(P.RemoveAll(self.id, force, pattern)).count

    def remove_by_regex(self, regex: str, force: bool = False) -> int:
        """Mooncake's ``remove_by_regex``: keys ``re.search``-matching ``regex``. Bounded by a
        time budget on the master (InvalidParams when exceeded or for a bad expression)."""
        return self.conn.call(P.RemoveAll(self.id, force, regex=regex)).count

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Unmount our segments (their objects vanish), stop heartbeats, close the engine."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.writes.close()  # queued file writes first: they are acknowledged puts
        self.heartbeat.stop()
        for name in list(self.segments):
            with contextlib.suppress(KvcakeError):
                self.conn.call(P.Unmount(self.id, name))
        self.segments.clear()
        self.engine.close()
        self.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connection(address: str, *args: Any, **kw: Any) -> MasterConnection:
    if address.startswith("etcd://"):  # HA: find the leader through etcd and follow it
        return FailoverConnection(address, *args, **kw)
    return MasterConnection(address, *args, **kw)
