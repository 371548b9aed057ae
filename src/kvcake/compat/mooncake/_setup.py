"""``setup`` (both of Mooncake's overloads), lifecycle, and segment management.

``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False, ssd_offload_path='',
tenant_id='default', enable_client_http_server=False, client_http_port=9300)`` or
``setup(config: dict)``. ``protocol`` selects kvcake's transport (``tcp``; kvcake also takes
``auto``/``shm``); ``enable_ssd_offload`` makes this client a storage node with a disk tier in
``ssd_offload_path`` (offload on eviction, promotion on repeated hits: kvcake's SSD tier)."""

from __future__ import annotations

import errno
import inspect
import itertools
import logging
import os
import random
from pathlib import Path
from typing import Any

from kvcake.compat.mooncake._base import Conn, check_signature
from kvcake.compat.mooncake._metadata import check_metadata_server
from kvcake.core.config import parse_size
from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.ports import bindable
from kvcake.store import errors as E
from kvcake.store import protocol as P
from kvcake.store.client import Client
from kvcake.store.config import ClientConfig, StoreServerConfig
from kvcake.store.server import StoreServer

_NODES = itertools.count()  # SSD stores started by this process

log = logging.getLogger(__name__)
DEFAULT_SIZE = 16 * 1024 * 1024
PROTOCOLS = {"tcp": "tcp", "auto": "auto", "shm": "shm"}
SSD_QUOTA_ENV = "MOONCAKE_OFFLOAD_SSD_QUOTA"
TE_PORTS = (12300, 14300)  # where Mooncake's Transfer Engine picks its port


def _positional(
    local_hostname: str,
    metadata_server: str,
    global_segment_size: int,
    local_buffer_size: int,
    protocol: str,
    rdma_devices: str,
    master_server_addr: str,
    engine: object = None,
    enable_ssd_offload: bool = False,
    ssd_offload_path: str = "",
    tenant_id: str = "default",
    enable_client_http_server: bool = False,
    client_http_port: int = 9300,
) -> None: ...


SETUP_SIGNATURE = inspect.signature(_positional)
DICT_KEYS = {
    "local_hostname", "metadata_server", "global_segment_size", "local_buffer_size", "protocol",
    "rdma_devices", "master_server_addr", "ipc_socket_path", "enable_ssd_offload",
    "ssd_offload_path", "tenant_id", "enable_client_http_server", "client_http_port",
    "master_server_address", "device_name",  # spellings older kvcake callers used
}  # fmt: skip


def _client(cfg: ClientConfig, name: str, with_port: bool) -> Client:
    """A client whose Transfer Engine listens, as Mooncake's does when the hostname names no
    port, on a free port drawn from 12300-14300 (a port taken meanwhile: the next one)."""
    if not with_port:
        return Client(cfg, segment_name=name)
    for port in random.sample(range(TE_PORTS[0], TE_PORTS[1] + 1), 20):
        if not bindable(port, cfg.hostname):
            continue
        try:
            return Client(cfg, segment_name=name, transfer_port=port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    return Client(cfg, segment_name=name)  # the range is crowded: any port


class Lifecycle:
    """setup (both overloads), close, health and identity. Fills and empties the
    Conn: a store is set up once (a second setup reports success and changes nothing) and
    closed any number of times; ``close`` empties the registered-buffer table it shares with
    the pointer calls. Not to be raced by other calls (as the wheel's setup and close)."""

    def __init__(self, conn: Conn, registered: dict[int, int]) -> None:
        self._conn = conn
        self._registered = registered

    def setup(self, *args: Any, **kwargs: Any) -> int:
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            return self._setup_dict(args[0])
        try:
            bound = SETUP_SIGNATURE.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"setup(): incompatible function arguments: {exc}") from None
        bound.apply_defaults()
        a = bound.arguments
        check_signature(
            a["local_hostname"], a["metadata_server"], a["global_segment_size"],
            a["local_buffer_size"], a["protocol"], a["rdma_devices"], a["master_server_addr"],
            kinds=(str, str, int, int, str, str, str),
        )  # fmt: skip
        return self._setup(**a)

    def _setup_dict(self, cfg: dict[str, Any]) -> int:
        if "local_hostname" not in cfg or "metadata_server" not in cfg:
            return E.INVALID_PARAMS
        try:
            return self._setup(
                local_hostname=str(cfg["local_hostname"]),
                metadata_server=str(cfg["metadata_server"]),
                global_segment_size=parse_size(cfg.get("global_segment_size", DEFAULT_SIZE)),
                local_buffer_size=parse_size(cfg.get("local_buffer_size", DEFAULT_SIZE)),
                protocol=str(cfg.get("protocol", "tcp")),
                rdma_devices=str(cfg.get("rdma_devices", cfg.get("device_name", ""))),
                master_server_addr=str(
                    cfg.get("master_server_addr", cfg.get("master_server_address", ""))
                ),
                enable_ssd_offload=bool(cfg.get("enable_ssd_offload", False)),
                ssd_offload_path=str(cfg.get("ssd_offload_path", "")),
            )
        except (KvcakeError, TypeError, ValueError):
            return E.INVALID_PARAMS

    def _setup(
        self,
        local_hostname: str,
        metadata_server: str,
        global_segment_size: int,
        local_buffer_size: int,
        protocol: str,
        rdma_devices: str,
        master_server_addr: str,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        **_unused: Any,
    ) -> int:
        if self._conn.client is not None:
            return 0  # the wheel keeps its first setup and reports success
        proto = os.environ.get("KVCAKE_SHIM_PROTOCOL") or PROTOCOLS.get(protocol.lower())
        if proto is None or global_segment_size < 0 or local_buffer_size < 0:
            log.error("setup: protocol %r is not available in kvcake (tcp, auto, shm)", protocol)
            return E.INVALID_PARAMS
        code = check_metadata_server(metadata_server)
        if code:
            return code
        host, _, _port = local_hostname.partition(":")
        try:
            ssd = ssd_offload_path if enable_ssd_offload else None
            self._conn.client = self._connect(
                local_hostname, master_server_addr, proto, global_segment_size, ssd
            )
        except StoreError as exc:
            log.error("setup failed: %s", exc)
            return E.INTERNAL_ERROR if exc.code == E.RPC_FAIL else exc.code
        except (KvcakeError, OSError, ValueError) as exc:
            log.error("setup failed: %s", exc)
            return E.INVALID_PARAMS
        self._conn.local_buffer = local_buffer_size
        port = _port or self._conn.client.engine.addresses[0].rsplit(":", 1)[1]
        self._conn.hostname = f"{host or '127.0.0.1'}:{port}"
        return 0

    def _connect(
        self, local_hostname: str, master: str, proto: str, segment: int, ssd_path: str | None
    ) -> Client:
        """The kvcake client: a storage node's (with a disk tier in ``ssd_path``) or a plain one."""
        host, _, _port = local_hostname.partition(":")
        if ssd_path is not None:
            # Mooncake names the segment "host:port"; each store of a process has its own
            # (two SSD stores of one process on one hostname must not collide).
            name = local_hostname if _port else f"store-{host}-{os.getpid()}-{next(_NODES)}"
            return self._start_node(master, host, segment, ssd_path, name)
        cfg = ClientConfig(
            master=master or "127.0.0.1:50051",
            hostname=host or "127.0.0.1",
            protocol=proto,
            segment_size=segment,
        )
        # Mooncake names a client's segment by its hostname, "host:port" (the engine's port
        # unless one is given); preferred_segments and replica calls use that name.
        name = local_hostname if _port else f"{host or '127.0.0.1'}:{{port}}"
        return _client(cfg, name, with_port=not _port)

    def _start_node(self, master: str, host: str, segment: int, path: str, name: str) -> Client:
        """A client with a disk tier: kvcake's store-server, in this process."""

        path = path or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "")
        if not path or segment <= 0:
            raise E.InvalidParams("enable_ssd_offload needs ssd_offload_path and a segment")
        quota = parse_size(os.environ.get(SSD_QUOTA_ENV, "4GiB"))
        cfg = StoreServerConfig(
            master=master, hostname=host or "127.0.0.1", segment_size=segment,
            ssd_dir=Path(path), ssd_quota=quota, name=name,
        )  # fmt: skip
        self._conn.server = StoreServer(cfg)
        try:
            self._conn.server.start()
        except BaseException:
            self._conn.server.stop()
            self._conn.server = None
            raise
        assert self._conn.server.client is not None
        return self._conn.server.client

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """The wheel's init_all after setup reports 'already initialized' (-600)."""
        check_signature(protocol, device_name, mount_segment_size, kinds=(str, str, int))
        return E.INVALID_PARAMS if self._conn.client is not None else E.INTERNAL_ERROR

    def close(self) -> int:
        """Stops the store server or closes the client (the store's Replicas closed first)."""
        if self._conn.server is not None:
            self._conn.server.stop()
            self._conn.server = None
        elif self._conn.client is not None:
            self._conn.client.close()
        self._conn.client = None
        self._registered.clear()
        return 0

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable."""
        if self._conn.client is None:
            return 1
        try:
            self._conn.client.conn.call(P.Heartbeat("", self._conn.client.host))
        except KvcakeError:
            return 2
        return 0

    def get_hostname(self) -> str:
        """``host:port`` of this client's transfer server (Mooncake's segment name form)."""
        return self._conn.hostname

    def get_offload_rpc_read_count(self) -> int:
        """Reads of offloaded (SSD-tier) values served over the owning node's disk service."""
        return self._conn.client.disk_reads if self._conn.client is not None else 0

    def alloc_from_mem_pool(self, size: int) -> int:
        """0: no dummy-client memory pool (as the wheel); an attached dummy's comes from
        ``_dummy_store.DummyLifecycle.alloc_from_mem_pool``."""
        check_signature(size, kinds=(int,))
        return 0
