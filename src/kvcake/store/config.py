"""Settings of the master, the storage node and the client (frozen, validated; loaded with
:func:`kvcake.core.config.load_config` from flags, ``KVCAKE_<SECTION>_*`` and TOML)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvcake.core.config import require, size_field


@dataclass(frozen=True)
class MasterConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    http_port: int = 9003  # 0 = pick a free port; -1 = no HTTP
    directory_port: int = 0  # the embedded Transfer Engine DirectoryService; 0 = free port
    client_ttl_s: float = 10.0
    lease_ttl_s: float = 10.0
    put_start_timeout_s: float = 30.0  # an unfinished put_start older than this may be pre-empted
    put_start_discard_s: float = 30.0  # pre-empted space is reused only after this much longer
    high_watermark: float = 0.90
    eviction_ratio: float = 0.05
    eviction_interval_s: float = 0.01
    busy_poll_us: float = 50.0  # client requests: poll before sleeping (TransferConfig doc)
    allocation_strategy: str = "random"
    default_soft_pin_ttl_ms: int = 30 * 60 * 1000
    max_soft_pin_ttl_ms: int = 24 * 3600 * 1000
    promote_after_hits: int = 2  # disk-tier hits before an object is copied back to memory
    offload_on_evict: bool = True
    seed: int = 0
    # Retry safety (docs/store.md, "Retry semantics"): remembered client sessions, and
    # unacknowledged replies kept per session.
    dedup_sessions: int = 4096
    dedup_pending: int = 64
    # Limits (docs/store.md, "Limits"): concurrent RPC connections, bytes of one request.
    max_connections: int = 1024
    max_request_bytes: int = size_field("16MiB")
    # Work of one eviction step under the lock: at most evict_batch objects looked at and at
    # most evict_step_ms of time (0 = no time bound); the housekeeper loops, releasing the lock.
    evict_batch: int = 64
    evict_step_ms: float = 0.3
    # KV events (zmq PUB on tcp://host:events_port; 0 = a free port, -1 = no events).
    events_port: int = 0
    events_buffer: int = 65536  # events queued for the publisher thread; beyond: dropped + gap
    # Where they bind (store/events_policy.py): "" = master.host with a shared secret (the
    # stream is then CURVE-encrypted for secret holders only), else 127.0.0.1; a host set here
    # is used as given (plaintext, with a warning, when there is no secret).
    events_host: str = ""
    # The ecosystem-format KV events (vLLM's wire format, for other routers): off (-1) by
    # default; bound to 127.0.0.1 unless events_public_host is set; plaintext always (other
    # consumers speak no CURVE), so with a shared secret only with events_allow_plain = true.
    ecosystem_events_port: int = -1
    events_public_host: str = ""
    events_allow_plain: bool = False
    # Tenants (store/tenants.py): "NAME=SIZE" byte quotas, and the quota of other named tenants
    # (0 = unlimited). Puts without a tenant are never limited.
    tenant_quotas: tuple[str, ...] = ()
    tenant_quota: int = size_field(0)
    # The shared file tier (store/filetier.py, docs/store.md "File tier"): every put is also
    # written to a file under root_fs_dir/<cluster>/ by its client; evicted objects stay
    # readable from there. None = off. Quota 0 = 90% of that filesystem's size.
    root_fs_dir: Path | None = None
    root_fs_quota: int = size_field(0)

    @property
    def writer_grace_s(self) -> float:
        """How long a range a writer may still be writing into (a revoked or pre-empted put,
        an expired writer's, an aborted copy's) stays unused: ``put_start_discard_s``, and at
        least the client TTL, since a storage node paused shorter than that keeps the bytes
        queued in its sockets and writes them when it wakes (docs/store.md, "Guarantees")."""
        return max(self.put_start_discard_s, self.client_ttl_s)

    def __post_init__(self) -> None:
        # lazy: CLI start-up
        from kvcake.store.strategy import STRATEGIES

        require(0 <= self.port < 65536, f"master.port must be in [0, 65535], got {self.port}")
        require(-1 <= self.http_port < 65536, "master.http_port must be -1, 0 or a port")
        require(self.client_ttl_s > 0, "master.client_ttl_s must be > 0")
        require(self.lease_ttl_s > 0, "master.lease_ttl_s must be > 0")
        require(0 <= self.busy_poll_us <= 10_000, "master.busy_poll_us must be in [0, 10000]")
        require(self.put_start_timeout_s > 0, "master.put_start_timeout_s must be > 0")
        require(self.put_start_discard_s >= 0, "master.put_start_discard_s must be >= 0")
        require(0 < self.high_watermark <= 1, "master.high_watermark must be in (0, 1]")
        require(0 < self.eviction_ratio <= 1, "master.eviction_ratio must be in (0, 1]")
        require(self.eviction_interval_s > 0, "master.eviction_interval_s must be > 0")
        require(
            self.allocation_strategy in STRATEGIES,
            f"master.allocation_strategy must be one of {sorted(STRATEGIES)}, "
            f"got {self.allocation_strategy!r}",
        )
        require(self.promote_after_hits >= 1, "master.promote_after_hits must be >= 1")
        require(self.dedup_sessions >= 1, "master.dedup_sessions must be >= 1")
        require(self.dedup_pending >= 1, "master.dedup_pending must be >= 1")
        require(self.max_connections >= 1, "master.max_connections must be >= 1")
        require(
            4096 <= self.max_request_bytes <= 1 << 30,
            "master.max_request_bytes must be in [4KiB, 1GiB]",
        )
        require(self.evict_batch >= 1, "master.evict_batch must be >= 1")
        require(0 <= self.evict_step_ms <= 1000, "master.evict_step_ms must be in [0, 1000]")
        require(-1 <= self.events_port < 65536, "master.events_port must be -1, 0 or a port")
        require(self.events_buffer >= 16, "master.events_buffer must be >= 16")
        require(
            -1 <= self.ecosystem_events_port < 65536,
            "master.ecosystem_events_port must be -1 (off), 0 or a port",
        )
        # lazy: CLI start-up
        from kvcake.store.tenants import parse_quotas

        parse_quotas(self.tenant_quotas)  # ConfigError names a bad entry
        require(0 <= self.root_fs_quota <= 1 << 50, "master.root_fs_quota must be in [0, 1PiB]")


@dataclass(frozen=True)
class ClientConfig:
    master: str = "127.0.0.1:50051"  # host:port of the master's RPC
    hostname: str = "127.0.0.1"  # this host as peers see it (replica choice, local_first)
    protocol: str = "auto"  # auto (shared memory on the same host) | tcp | shm
    segment_size: int = size_field(0)  # DRAM this client contributes; 0 = pure client
    rpc_timeout_s: float = 30.0
    rpc_retries: int = 2  # re-sends after a timeout or broken connection (safe: deduplicated)
    # The deadline of each try of a master call (heartbeats included): a frozen master holds a
    # call this long, then it goes to the leader again (etcd://). 0 = a third of the master's
    # client TTL, at most rpc_timeout_s (store/liveness.py, call_deadline_s).
    master_call_timeout_s: float = 0.0
    tune_malloc: bool = True  # keep freed value buffers warm (see kvcake.store.memtune)
    busy_poll_us: float = 50.0  # master replies: poll before sleeping (TransferConfig doc)
    tenant: str = ""  # puts are charged to this tenant's quota (master.tenant_quotas)
    space_wait_s: float = 5.0  # memory full while offloads to disk run: re-put this long
    # File tier (master.root_fs_dir): bytes of finished puts queued for the background writer;
    # a put waits while the queue is fuller than this.
    file_queue_bytes: int = size_field("256MiB")
    # Integrity (docs/store.md, "Integrity"): puts compute the values' checksums, reads verify
    # every chunk they cover. False exists ONLY for the cost benchmark (verification on vs
    # off): puts then send no checksums, and no verifying reader accepts those objects.
    verify: bool = True

    def __post_init__(self) -> None:
        require(":" in self.master, f"client.master must be host:port, got {self.master!r}")
        # lazy: CLI start-up
        from kvcake.store.tenants import TENANT_RE

        require(
            not self.tenant or bool(TENANT_RE.match(self.tenant)),
            f"client.tenant {self.tenant[:80]!r}: use 1-64 characters [A-Za-z0-9._-]",
        )
        require(
            self.protocol in ("auto", "tcp", "shm"),
            f"client.protocol must be auto, tcp or shm, got {self.protocol!r}",
        )
        require(self.rpc_timeout_s > 0, "client.rpc_timeout_s must be > 0")
        require(
            0 <= self.master_call_timeout_s <= 3600,
            "client.master_call_timeout_s must be in [0, 3600]",
        )
        require(self.space_wait_s >= 0, "client.space_wait_s must be >= 0")
        require(self.file_queue_bytes > 0, "client.file_queue_bytes must be > 0")
        require(0 <= self.rpc_retries <= 10, "client.rpc_retries must be in [0, 10]")
        require(0 <= self.busy_poll_us <= 10_000, "client.busy_poll_us must be in [0, 10000]")


@dataclass(frozen=True)
class StoreServerConfig:
    master: str = "127.0.0.1:50051"
    hostname: str = "127.0.0.1"
    segment_size: int = size_field("1GiB")
    ssd_dir: Path | None = None
    ssd_quota: int = size_field("4GiB")
    name: str = ""  # segment name; default store-<host>-<pid>
    disk_port: int = 0  # TCP port serving the SSD tier to readers
    http_port: int = 0  # /health and /metrics; 0 = a free port, -1 = none
    # The deadline of each try of a master call, heartbeats included (client.*'s; 0 = a third
    # of the master's client TTL): a frozen leader must not hold the node's heartbeat until
    # the new leader expired it.
    master_call_timeout_s: float = 0.0
    name_wait_s: float = field(
        default=60.0,
        metadata={
            "help": "seconds a node restarted under its --name waits for the name's previous "
            "holder to be released (it is at once when that holder ran on this host and is "
            "gone; else when its lease, the master's client TTL, expires)"
        },
    )

    def __post_init__(self) -> None:
        require(":" in self.master, f"store.master must be host:port, got {self.master!r}")
        require(0 <= self.name_wait_s <= 3600, "store.name_wait_s must be in [0, 3600]")
        require(
            0 <= self.master_call_timeout_s <= 3600,
            "store.master_call_timeout_s must be in [0, 3600]",
        )
        require(self.segment_size > 0, "store.segment_size must be > 0")
        require(self.ssd_quota > 0, "store.ssd_quota must be > 0")
        require(0 <= self.disk_port < 65536, "store.disk_port must be a port")
        require(-1 <= self.http_port < 65536, "store.http_port must be -1, 0 or a port")
