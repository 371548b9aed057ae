"""``mooncake_client``'s command line (Mooncake's standalone *real client*, 0.3.13's
``real_client_main.cpp`` and ``real_client.cpp`` flags) mapped onto kvcake's storage node,
:class:`kvcake.store.config.StoreServerConfig`. gflags forms are parsed by
:mod:`.master_flags`; the table is in docs/compat/mooncake.md."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kvcake.compat.mooncake import gflags
from kvcake.compat.mooncake.flag_catalog import CLIENT, common
from kvcake.compat.mooncake.mooncake_config import parse_segment_size
from kvcake.core.config import parse_size
from kvcake.core.errors import ConfigError
from kvcake.store.config import StoreServerConfig

PROG = "mooncake_client"
# Mooncake's flag -> (its default, meaning and kvcake's use)
FLAGS: dict[str, tuple[str, str]] = {
    "master_server_address": ("127.0.0.1:50051", "the master's RPC host:port (etcd://… for HA)"),
    "global_segment_size": ("4 GB", "DRAM this node mounts into the pool (1024-based units)"),
    "port": ("50052", "the dummy-client service port (setup_dummy attaches here)"),
    "host": ("0.0.0.0", "this node's address as peers see it (kvcake keeps 127.0.0.1 for 0.0.0.0)"),
    "protocol": ("tcp", "tcp (kvcake's TCP transport); kvcake has no RDMA"),
    "metadata_server": (
        "http://127.0.0.1:8080/metadata",
        "accepted; kvcake finds segments through the master's directory",
    ),
    "local_buffer_size": ("0", "accepted (size checked); a storage node needs no local buffer"),
    "enable_offload": ("false", "SSD tier in $MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"),
    "enable_http_server": ("false", "serve /health and /metrics on --http_port (else a free port)"),
    "http_port": ("9300", "the HTTP port with --enable_http_server"),
}
IGNORED = (
    "device_names", "threads", "start_offload_rpc_server", "tenant_id", "mmap_arena_pool_size",
    "use_mmap_arena_allocator",
)  # fmt: skip
QUIET = {"metadata_server"}  # no warning for these (glog's flags: none either)
OFFLOAD_PATH_ENV = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
OFFLOAD_QUOTA_ENV = "MOONCAKE_OFFLOAD_SSD_QUOTA"


@dataclass(frozen=True)
class RealClientArgs:
    store: StoreServerConfig
    port: int  # the dummy-client service (real_client_ipc)


def catalog() -> dict[str, gflags.GFlag]:
    """Every flag of 0.3.13's mooncake_client (:data:`.flag_catalog.CLIENT`) and glog/gflags',
    with kvcake's use (``--help``)."""
    flags = gflags.table(CLIENT, "accepted, ignored by kvcake")
    for name, (_, meaning) in FLAGS.items():
        f = flags[name]
        flags[name] = gflags.GFlag(name, f.kind, f.default, f"kvcake: {meaning}")
    return {**flags, **common()}


def parse(argv: list[str]) -> RealClientArgs:
    """Mooncake's flags -> kvcake's settings (``port``: the dummy-client service). gflags'
    errors (an unknown flag, an illegal value) raise :class:`.gflags.GFlagsExit` (status 1, as
    the wheel's program), a value kvcake cannot use raises :class:`ConfigError`."""
    flags = catalog()
    parsed = gflags.parse(flags, argv)
    if any(gflags.to_bool(parsed.values.get(h, "false")) for h in ("help", "helpfull")):
        raise gflags.GFlagsExit(1, gflags.help_text(PROG, {PROG: flags}), to_stdout=True)
    if gflags.to_bool(parsed.values.get("version", "false")):
        raise gflags.GFlagsExit(0, f"{PROG} version 0.3.13.post1 (kvcake)", to_stdout=True)
    for name in sorted(set(parsed.values) & set(IGNORED) - QUIET):
        print(f"{PROG}: --{name} has no kvcake counterpart; ignored", file=sys.stderr)
    flag = {k: parsed.flag(k, flags) for k in FLAGS}
    port = _port(flag["port"])
    http_port = _port(flag["http_port"]) if gflags.to_bool(flag["enable_http_server"]) else 0
    protocol = flag["protocol"].strip().lower()
    if protocol not in ("tcp", "auto", "shm"):
        raise ConfigError(f"--protocol={protocol}: kvcake has no {protocol}; use --protocol=tcp")
    parse_segment_size(flag["local_buffer_size"])  # as Mooncake: a bad size is an error
    ssd_dir, ssd_quota = _offload(gflags.to_bool(flag["enable_offload"]) is True)
    store = StoreServerConfig(
        master=flag["master_server_address"],
        hostname=_host(flag["host"]),
        segment_size=_segment_size(flag["global_segment_size"]),
        http_port=http_port,
        ssd_dir=ssd_dir,
        ssd_quota=ssd_quota,
    )
    return RealClientArgs(store, port)


def _port(text: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(f"--port={text}: a TCP port (1-65535)")
    return int(text)


def _host(text: str) -> str:
    if text in ("", "0.0.0.0"):
        return "127.0.0.1"  # Mooncake's default names every interface; kvcake stays on loopback
    return text


def _segment_size(text: str) -> int:
    try:
        size = parse_segment_size(text)
    except ValueError as exc:
        raise ConfigError(f"--global_segment_size: {exc}") from exc
    if size <= 0:
        raise ConfigError("--global_segment_size must be > 0 (a kvcake storage node mounts memory)")
    return size


def _offload(enabled: bool) -> tuple[Path | None, int]:
    """(SSD tier directory, quota): Mooncake's offload settings come from the environment."""
    if not enabled:
        return None, parse_size("4GiB")
    quota = parse_size(os.environ.get(OFFLOAD_QUOTA_ENV, "4GiB"))
    path = os.environ.get(OFFLOAD_PATH_ENV, "")
    if not path:
        raise ConfigError(f"--enable_offload needs ${OFFLOAD_PATH_ENV} (the SSD tier's directory)")
    return Path(path), quota
