"""The master process: RPC over kvcake frames (one thread per connection), a housekeeping thread
(eviction at the high watermark, client expiry, reclaiming pre-empted space), the embedded
Transfer Engine DirectoryService and the HTTP endpoints.

A request that cannot be decoded gets an :class:`ErrorReply` and its connection is closed; the
server keeps serving everyone else. Per-key failures travel as codes inside a normal reply.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVarTuple

import msgspec
from fastapi import APIRouter

from kvcake.core import auth as _auth
from kvcake.core import framing
from kvcake.core.errors import ConfigError, FramingError, StoreError
from kvcake.core.ids import ClientId, SegmentName
from kvcake.net.netserver import ThreadedServer
from kvcake.store import protocol as P
from kvcake.store.config import MasterConfig
from kvcake.store.dedup import StaleRequest
from kvcake.store.deferred_reply import DeferredReply, ReplySender
from kvcake.store.disk import close_gracefully
from kvcake.store.errors import INTERNAL_ERROR, INVALID_PARAMS, SegmentAlreadyExists
from kvcake.store.events import EventPublisher
from kvcake.store.events_policy import ecosystem_events_host, own_events_host
from kvcake.store.filetier import default_quota
from kvcake.store.http import MasterHttp
from kvcake.store.leadership import NOT_HELD, SOLE, Leadership, seal
from kvcake.store.liveness import PauseWatch
from kvcake.store.master_state import MasterState
from kvcake.store.metadata import Tier
from kvcake.store.metadata_http import MetadataKV
from kvcake.store.metrics import MasterMetrics
from kvcake.store.owners import OwnerWatch, ReleasingBackend, process_of
from kvcake.store.rpc import BufferedFrames, send_msg
from kvcake.store.vllm_events import BlockTable, VllmEventStream
from kvcake.transfer.metadata import DirectoryService

log = logging.getLogger(__name__)
Ts = TypeVarTuple("Ts")
EVICT_STEPS_PER_TICK = 1000
EVICT_YIELD_S = 0.0001


_OK = P.KeyResult(0)  # frozen: one shared instance for every successful key


def _ok_per_key(
    keys: list[str], fn: Callable[..., object], *args: Any, each: list[Any] | None = None
) -> P.Reply:
    """``_per_key`` for calls whose per-key result is just success: ``fn(*args, key)``, or
    ``fn(*args, key, each[i])`` with ``each`` (one per key), no wrapper per call."""
    results = []
    for key, item in zip(keys, keys if each is None else each, strict=True):
        try:
            fn(*args, key) if each is None else fn(*args, key, item)
            results.append(_OK)
        except StoreError as exc:
            results.append(P.KeyResult(exc.code, message=str(exc)))
    return P.Reply(results=results)


def _per_key(keys: list[str], fn: Callable[[str], P.KeyResult]) -> P.Reply:
    results = []
    for key in keys:
        try:
            results.append(fn(key))
        except StoreError as exc:
            results.append(P.KeyResult(exc.code, message=str(exc)))
    return P.Reply(results=results)


class MasterHandlers:
    """Maps each request type to a handler (a registry, so new calls are one entry)."""

    def __init__(
        self,
        state: MasterState,
        directory: Callable[[], str],
        events: Callable[[], str] = lambda: "",
        blocks: BlockTable | None = None,
    ):
        self.state = state
        self.write_lease_ms = int(state.cfg.writer_grace_s * 1000)  # (store/fences.py)
        self.blocks = blocks  # writers' block lineage for the vLLM-format events (or None)
        self.directory = directory
        self.events = events
        self.table: dict[type, Callable[[Any], P.Reply]] = {
            P.Heartbeat: self.heartbeat,
            P.Mount: self.mount,
            P.Unmount: self.unmount,
            P.PutStart: self.put_start,
            P.PutEnd: self.put_end,
            P.PutRevoke: self.put_revoke,
            P.GetReplicas: self.get_replicas,
            P.Exist: self.exist,
            P.Remove: self.remove,
            P.RemoveAll: self.remove_all,
            P.TakeTasks: self.take_tasks,
            P.TaskDone: self.task_done,
            P.KvSnapshot: self.kv_snapshot,
            P.BlockInfo: self.block_info,
            P.ReplicaCopyStart: self.copy_start,
            P.ReplicaCopyEnd: self.copy_end,
            P.ReplicaDrop: self.drop_replica,
            P.ReplicaBad: self.replica_bad,
        }

    def dispatch(self, msg: msgspec.Struct) -> P.Reply:
        """Answer one request. Mutating requests run through :meth:`MasterState.once`, so a
        retried one (same ``rid``) is applied once and its first reply is replayed."""
        rid = getattr(msg, "rid", None)
        if type(msg) is P.RemoveAll:  # match off the lock, remove under it
            try:
                keys = self.state.match_keys(msg.pattern, msg.regex)
            except StoreError as exc:
                return P.Reply(code=exc.code, message=str(exc))
            run: Callable[[], P.Reply] = lambda: P.Reply(  # noqa: E731
                count=self.state.remove_keys(keys, msg.force)
            )
            if rid is None:
                return run()
            return self._once(ClientId(msg.client), rid, run)
        if rid is None:
            return self._run(msg)
        try:  # the hot path, inline: no closure per request, ``once`` passes ``msg`` on
            return self.state.once(msg.client, rid, self._run, msg)  # type: ignore[attr-defined]
        except StaleRequest as exc:
            return P.Reply(code=INVALID_PARAMS, message=f"stale duplicate: {exc}")

    def _once(
        self, client: ClientId, rid: P.ReqId, apply: Callable[[*Ts], P.Reply], *args: *Ts
    ) -> P.Reply:
        try:
            return self.state.once(client, rid, apply, *args)
        except StaleRequest as exc:
            return P.Reply(code=INVALID_PARAMS, message=f"stale duplicate: {exc}")

    def _run(self, msg: msgspec.Struct) -> P.Reply:
        try:
            return self.table[type(msg)](msg)
        except StoreError as exc:
            return P.Reply(code=exc.code, message=str(exc))

    def heartbeat(self, m: P.Heartbeat) -> P.Reply:
        todo = self.state.heard(ClientId(m.client), m.host) if m.client else 0
        ttl = int(self.state.cfg.client_ttl_s * 1000)
        notes, floors = (
            self.state.fence_notes(ClientId(m.client), m.fenced) if m.client else ([], [])
        )
        return P.Reply(
            count=todo,
            client_ttl_ms=ttl,
            directory=self.directory(),
            events=self.events(),
            fences=notes,
            floors=floors,
        )

    def mount(self, m: P.Mount) -> P.Reply:
        if m.tier not in ("memory", "disk"):
            return P.Reply(code=INVALID_PARAMS, message=f"unknown tier {m.tier!r}")
        try:
            rejected = self.state.mount(
                ClientId(m.client),
                m.host,
                SegmentName(m.segment),
                m.capacity,
                Tier(m.tier),
                m.endpoint,
                m.existing,
                m.existing_sums,
                m.host_id,
            )
        except SegmentAlreadyExists as exc:  # who holds it: a successor may know it is gone
            return P.Reply(code=exc.code, message=str(exc), holder=list(exc.holder or ()))
        floors = self.state.fence_floors(ClientId(m.client))  # (its notes come by heartbeat)
        ttl_ms = int(self.state.cfg.client_ttl_s * 1000)
        return P.Reply(rejected=rejected, client_ttl_ms=ttl_ms, floors=floors)

    def unmount(self, m: P.Unmount) -> P.Reply:
        self.state.unmount(ClientId(m.client), SegmentName(m.segment))
        return P.Reply()

    def put_start(self, m: P.PutStart) -> P.Reply:
        if len(m.keys) != len(m.sizes):
            return P.Reply(code=INVALID_PARAMS, message="keys and sizes differ in length")
        cid = ClientId(m.client)
        start = self.state.put_start
        host, opts, upsert, tenant = m.host, m.options, m.upsert, m.tenant
        fence = self.state.new_fence()  # one per request: a batch's writes go as one frame
        results = []
        for key, size in zip(m.keys, m.sizes, strict=True):
            try:
                reps = start(cid, host, key, size, opts, upsert, tenant, fence)
                results.append(P.KeyResult(0, size, reps))
            except StoreError as exc:
                results.append(P.KeyResult(exc.code, message=str(exc)))
        return P.Reply(results=results, write_lease_ms=self.write_lease_ms)

    def put_end(self, m: P.PutEnd) -> P.Reply:
        cid = ClientId(m.client)
        if not m.sums:
            return _ok_per_key(m.keys, self.state.put_end, cid)
        if len(m.sums) != len(m.keys):
            return P.Reply(code=INVALID_PARAMS, message="keys and checksum lists differ in length")
        # (the pairs as they came: a dict and a closure per call cost ~1 µs a key, most of
        # what checksums added to a small put at the master)
        return _ok_per_key(m.keys, self.state.put_end, cid, each=m.sums)

    def put_revoke(self, m: P.PutRevoke) -> P.Reply:
        cid = ClientId(m.client)
        return _ok_per_key(m.keys, self.state.put_revoke, cid)

    def get_replicas(self, m: P.GetReplicas) -> P.Reply:
        cid = ClientId(m.client)
        get = self.state.lookup
        results = []
        for key in m.keys:
            try:
                size, reps, sums = get(cid, key)
                results.append(P.KeyResult(0, size, reps, sums=sums))
            except StoreError as exc:
                results.append(P.KeyResult(exc.code, message=str(exc)))
        return P.Reply(results=results, lease_ms=int(self.state.cfg.lease_ttl_s * 1000))

    def exist(self, m: P.Exist) -> P.Reply:
        cid = ClientId(m.client)
        return _per_key(m.keys, lambda k: P.KeyResult(int(self.state.exist(cid, k))))

    def remove(self, m: P.Remove) -> P.Reply:
        remove, force = self.state.remove, m.force
        return _ok_per_key(m.keys, lambda k: remove(k, force))

    def remove_all(self, m: P.RemoveAll) -> P.Reply:
        return P.Reply(count=self.state.remove_all(m.force, m.pattern, m.regex))

    def take_tasks(self, m: P.TakeTasks) -> P.Reply:
        self.state.touch(ClientId(m.client), "")
        tasks = self.state.take_tasks(ClientId(m.client))
        return P.Reply(
            tasks=[(t.kind, t.key, t.size, t.mem_offset) for t in tasks],
            task_sums=[list(t.sums) for t in tasks],
        )

    def block_info(self, m: P.BlockInfo) -> P.Reply:
        if self.blocks is None:  # no vLLM-format stream: nothing to learn
            return P.Reply()
        try:
            for b in m.blocks:
                self.blocks.learn(b.hash, b.parent, b.tokens)
        except ValueError as exc:
            return P.Reply(code=INVALID_PARAMS, message=f"BlockInfo: {exc}")
        return P.Reply()

    def kv_snapshot(self, m: P.KvSnapshot) -> P.Reply:
        return P.Reply(snapshot=self.state.kv_snapshot(), events=self.events())

    def task_done(self, m: P.TaskDone) -> P.Reply:
        self.state.task_done(ClientId(m.client), m.kind, m.key, m.ok, m.offset)
        return P.Reply()

    def copy_start(self, m: P.ReplicaCopyStart) -> P.Reply:
        reps = self.state.copy_start(ClientId(m.client), m.key, list(m.targets))
        result = P.KeyResult(0, reps[0].size if reps else 0, reps)
        return P.Reply(results=[result], write_lease_ms=self.write_lease_ms)

    def copy_end(self, m: P.ReplicaCopyEnd) -> P.Reply:
        self.state.copy_end(ClientId(m.client), m.key, m.ok)
        return P.Reply()

    def drop_replica(self, m: P.ReplicaDrop) -> P.Reply:
        self.state.drop_replica(ClientId(m.client), m.key, m.segment)
        return P.Reply()

    def replica_bad(self, m: P.ReplicaBad) -> P.Reply:
        return P.Reply(count=int(self.state.replica_bad(m.key, m.segment, m.offset, m.sums)))


class MasterRpcServer(ThreadedServer):
    def __init__(
        self,
        host: str,
        port: int,
        handlers: MasterHandlers,
        metrics: MasterMetrics,
        busy_poll_us: float = 0.0,
        max_connections: int = 1024,
        max_request_bytes: int = 16 << 20,
        auth: _auth.Authenticator | None = None,
    ):
        super().__init__((host,), port, name=_auth.MASTER, auth=auth)
        self.handlers = handlers
        self.metrics = metrics
        self.busy_poll_us = busy_poll_us
        self.max_connections = max_connections
        self.max_conn_threads = max_connections + 64  # room to answer the refused ones
        self.limits = framing.FrameLimits(max_meta=max_request_bytes, max_data=0)
        self._active = 0
        self._active_lock = threading.Lock()
        self.leadership: Leadership = SOLE  # store/ha sets its election (lease + term)

    def _refuse(self, conn: socket.socket, message: str) -> None:
        with contextlib.suppress(OSError):
            refusal = P.ErrorReply(INVALID_PARAMS, message, self.leadership.term)
            framing.send_frame(conn, P.REPLY_CODEC, 0, refusal)
        close_gracefully(conn)

    def handle(self, conn: socket.socket, listen_address: str) -> None:
        with self._active_lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
        if full:  # one thread per connection: refuse rather than grow without bound
            self.metrics.refused.inc()
            return self._refuse(
                conn,
                f"too many connections to the master (master.max_connections = "
                f"{self.max_connections}); close idle clients or raise the limit",
            )
        try:
            self._serve_conn(conn)
        finally:
            with self._active_lock:
                self._active -= 1

    def _serve_conn(self, conn: socket.socket) -> None:
        reader = BufferedFrames(conn, P.REQUEST_CODEC, self.limits, self.busy_poll_us)
        while True:
            try:
                frame = reader.read()
            except FramingError as exc:
                self.metrics.bad_frames.inc()
                limit = self.limits.max_meta
                self._refuse(
                    conn,
                    f"bad request: {exc} (requests are limited to {limit} bytes: "
                    "master.max_request_bytes)",
                )
                return
            if frame is None:
                return
            if not self._answer(conn, frame.header.request_id, frame.msg):
                return  # the lease is gone: this master answers no one any more

    def _answer(self, conn: socket.socket, rid: int, msg: msgspec.Struct) -> bool:
        """Dispatch one request and send its reply (a deferred one may already be on the wire,
        sent by the thread that made it due), sealed right before the send: stamped with the
        term, or refused if the lease is not held now (store/leadership.py). False: refused."""
        op = type(msg).__name__
        sender = None  # only a deferred reply needs one (not every request's path)
        t0 = time.perf_counter()
        try:
            # Not even applied without the lease (a standby may lead: no event, no change).
            lead = self.leadership.held()
            out: msgspec.Struct | DeferredReply = self.handlers.dispatch(msg) if lead else NOT_HELD
            if isinstance(out, DeferredReply):
                sender = ReplySender(conn, rid, self.leadership)
                out = out.resolve(sender)
            reply = out
        except Exception as exc:  # a bug must cost one request, not the master
            log.exception("master: %s failed", op)
            reply = P.ErrorReply(INTERNAL_ERROR, f"internal error in {op}: {exc!r}")
        self.metrics.observe(op, time.perf_counter() - t0)
        reply, serving = seal(reply, self.leadership)
        if sender is None:
            send_msg(conn, P.REPLY_CODEC, rid, reply)
        else:
            sender.finish(reply)
        return serving


class Master:
    """A whole master: ``m = Master(cfg); m.start(); m.rpc_address; m.stop()``."""

    def __init__(
        self,
        config: MasterConfig,
        with_directory: bool = True,
        state_factory: Callable[..., MasterState] = MasterState,
        auth: _auth.Authenticator | None = None,
        cluster: str = "kvcake",
    ):
        """``cluster``: the pool's name (``--cluster``); the file tier lives in
        ``root_fs_dir/<cluster>``."""
        self.cfg = config
        # One shared secret for the RPC, the directory and the HTTP (None: the environment's).
        self.auth = auth = _auth.resolve(auth)
        # store/ha passes a factory of a journaled state rebuilt from its operation log.
        self.owners = OwnerWatch(
            lambda c: self.state.lease_expired(ClientId(c)), lambda: self.state.segments
        )
        self.state = state_factory(config, owner_dead=self.owners.segment_owner_dead)
        self.metrics = MasterMetrics(self.state)
        if config.root_fs_dir is not None:
            mount_file_tier(self.state, config, cluster)
        self.directory: DirectoryService | None = None
        if with_directory:
            # Lookups answer only while the lease holds, as the RPC does (store/leadership.py).
            self.owners.directory = backend = ReleasingBackend(
                self.owners.holder_gone, lambda: self.leadership.held()
            )
            self.directory = DirectoryService(
                config.host, config.directory_port, backend, auth or _auth.DISABLED
            )
        # The vLLM-format stream's block lineage (store/vllm_events.py), when that stream is on.
        self.blocks = BlockTable() if config.ecosystem_events_port >= 0 else None
        self.vllm_events: VllmEventStream | None = None
        self.rpc = MasterRpcServer(
            config.host,
            config.port,
            MasterHandlers(
                self.state,
                lambda: self.directory_address,
                lambda: self.events_address,
                self.blocks,
            ),
            self.metrics,
            config.busy_poll_us,
            config.max_connections,
            config.max_request_bytes,
            auth,
        )
        self.http: MasterHttp | None = None
        self.rpc.handlers.table[P.OwnerGone] = self._reported_gone

        self.metadata_kv = MetadataKV(self.directory.backend if self.directory else None)
        self.extra_routers: list[APIRouter] = []  # added to the HTTP app
        self.publisher: EventPublisher | None = None
        if config.events_port < 0 and config.ecosystem_events_port < 0:
            self.state.events.enabled = False
        self._stop = threading.Event()
        self._housekeeper = threading.Thread(target=self._housekeep, name="master-housekeeping")

    @property
    def leadership(self) -> Leadership:
        """Whether this master may answer now, and its term (HA: its election)."""
        return self.rpc.leadership

    @leadership.setter
    def leadership(self, lead: Leadership) -> None:
        self.rpc.leadership = lead

    @property
    def rpc_address(self) -> str:
        return self.rpc.addresses[0]

    @property
    def directory_address(self) -> str:
        return str(self.directory.address) if self.directory is not None else ""

    @property
    def events_address(self) -> str:
        return str(self.publisher.address) if self.publisher is not None else ""

    @property
    def http_address(self) -> str:
        return self.http.address if self.http is not None else ""

    def start(self) -> None:
        _auth.check_bind(self.cfg.host, self.auth, "the master")

        eco_host = ecosystem_events_host(self.cfg, self.auth)  # checked before anything binds
        if self.directory is not None:
            self.directory.start()
        if eco_host is not None and self.blocks is not None:
            self.vllm_events = VllmEventStream(
                self.blocks, eco_host, self.cfg.ecosystem_events_port
            )
            self.vllm_events.start()
        if self.cfg.events_port >= 0 or self.vllm_events is not None:
            host = own_events_host(self.cfg, self.auth)  # CURVE with a secret
            sinks = [self.vllm_events.offer] if self.vllm_events is not None else []
            self.publisher = EventPublisher(
                self.state.events, host, self.cfg.events_port, self.auth, sinks
            )
            self.publisher.start()
        self.rpc.start()
        if self.cfg.http_port >= 0:
            self.http = MasterHttp(self, self.cfg.host, self.cfg.http_port)
            self.http.start()
        self._housekeeper.start()

    def _reported_gone(self, m: P.OwnerGone) -> P.Reply:
        if not self.owners.successors.report(m.client, m.host_id, m.owner):
            why = f"{m.owner!r} is not known to have run on the reporter's host {m.host_id!r}"
            return P.Reply(code=INVALID_PARAMS, message=why)
        log.warning(
            "master: %s reports %s gone on their host; its names are free", m.client, m.owner
        )
        return P.Reply()

    def _client_gone(self, client: ClientId) -> None:
        if self.directory is None:
            return
        self.directory.drop_owner(client)
        # The process's other engines (an instance's KV segments) die with its last store
        # client's lease: on another host nothing else can tell they are gone.
        prefix = process_of(client)
        backend = self.directory.backend
        if prefix is None or not isinstance(backend, ReleasingBackend):
            return
        if not any(c.startswith(prefix) for c in self.state.clients):
            n = backend.delete_process(prefix)
            if n:
                log.warning("master: %d directory entries of %s* dropped with its lease", n, prefix)

    def _housekeep(self) -> None:
        next_expiry = 0.0
        pauses = PauseWatch(self.state, self.cfg.eviction_interval_s)
        while not self._stop.wait(self.cfg.eviction_interval_s):
            try:
                pauses.tick()  # before any expiry: the master's own pause is no client's silence
                for _ in range(EVICT_STEPS_PER_TICK):  # lock released between steps
                    if not self.state.maybe_evict() or self._stop.is_set():
                        break
                    time.sleep(EVICT_YIELD_S)  # let waiting RPC threads take the lock
                self.state.sweep_processing()
                self.state.reap_files()
                self.state.sweep_copies(lambda c: c in self.state.clients)
                now = time.monotonic()
                if now >= next_expiry:
                    next_expiry = now + min(0.1, self.cfg.client_ttl_s / 4)
                    for cid in self.state.expire_clients():
                        log.warning(
                            "master: client %s silent > %ss, unmounted", cid, self.cfg.client_ttl_s
                        )
                        self._client_gone(cid)
            except Exception:  # keep housekeeping alive whatever one pass hit
                log.exception("master: housekeeping pass failed")

    def stop(self) -> None:
        self._stop.set()
        if self._housekeeper.is_alive():
            self._housekeeper.join(timeout=2)
        self.rpc.stop()
        if self.http is not None:
            self.http.stop()
        if self.directory is not None:
            self.directory.stop()
        if self.publisher is not None:
            self.publisher.stop()
        if self.vllm_events is not None:
            self.vllm_events.stop()


def mount_file_tier(state: MasterState, cfg: MasterConfig, cluster: str) -> None:
    """Create ``root_fs_dir/<cluster>`` and its 256 subdirectories; the tier's quota is
    ``root_fs_quota`` or 90% of that filesystem."""

    assert cfg.root_fs_dir is not None
    directory = cfg.root_fs_dir.expanduser().resolve() / cluster
    try:
        for i in range(256):
            (directory / f"{i:02x}").mkdir(parents=True, exist_ok=True)
        quota = cfg.root_fs_quota or default_quota(directory)
    except OSError as exc:
        raise ConfigError(f"master.root_fs_dir: cannot use {directory}: {exc}") from exc
    state.mount_file_tier(str(directory), quota)
