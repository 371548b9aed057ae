"""``kvcake master`` accepts ``mooncake_master``'s flag names (gflags style: ``--rpc_port=50051``,
``-rpc_port 50051``, ``--enable_ha`` / ``--enable_ha=false``) with their units converted onto
kvcake's settings, so a Mooncake deployment's command line keeps working.

The mapping table is :data:`FLAGS` (docs/compat/mooncake.md lists it); flags of Mooncake features
kvcake has no counterpart for are accepted and ignored with a warning (:data:`IGNORED`)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvcake.core.errors import ConfigError

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*")
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def duration_ms(text: str) -> float:
    """Mooncake's TTL flags: raw milliseconds or a number with ms, s, m or h."""
    m = _DURATION.fullmatch(text)
    if not m:
        raise ConfigError(f"bad duration {text!r} (milliseconds, or 10s / 500ms / 30m / 1h)")
    return float(m.group(1)) * _UNIT_MS[m.group(2)]


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"bad boolean {text!r}")


def count(text: str) -> int:
    if not text.strip().isdigit():
        raise ConfigError(f"bad count {text!r} (a whole number >= 0)")
    return int(text)


@dataclass(frozen=True)
class Flag:
    dest: str  # kvcake's setting (argparse dest of kvcake master)
    convert: Callable[[str], Any]
    meaning: str


FLAGS: dict[str, Flag] = {
    "rpc_port": Flag("port", int, "RPC port"),
    "port": Flag("port", int, "RPC port (Mooncake's deprecated name)"),
    "rpc_address": Flag("host", str, "listen address (kvcake's default stays 127.0.0.1)"),
    "metrics_port": Flag("http_port", int, "HTTP port of /metrics and the admin API"),
    "client_ttl": Flag("client_ttl_s", float, "seconds -> client_ttl_s"),
    "default_kv_lease_ttl": Flag("lease_ttl_s", lambda v: duration_ms(v) / 1000, "ms -> s"),
    "default_kv_soft_pin_ttl": Flag(
        "default_soft_pin_ttl_ms", lambda v: int(duration_ms(v)), "ms (or 30m) -> ms"
    ),
    "max_kv_soft_pin_ttl": Flag(
        "max_soft_pin_ttl_ms", lambda v: int(duration_ms(v)), "ms (or 24h) -> ms"
    ),
    "eviction_high_watermark_ratio": Flag("high_watermark", float, "ratio"),
    "eviction_ratio": Flag("eviction_ratio", float, "ratio"),
    "allocation_strategy": Flag(
        "allocation_strategy", str, "random | free_ratio_first | local_first"
    ),
    "put_start_discard_timeout_sec": Flag("put_start_timeout_s", float, "s: pre-emption"),
    "offload_on_evict": Flag("offload_on_evict", boolean, "bool"),
    "promotion_admission_threshold": Flag(
        "promote_after_hits", lambda v: max(1, count(v)), "disk-tier hits before promotion (0 = 1)"
    ),
    "etcd_endpoints": Flag(
        "etcd_endpoints",
        lambda v: ",".join(f"http://{e}" if "://" not in e else e for e in v.split(";") if e),
        "a;b -> http://a,http://b (the HA issue's --etcd-endpoints)",
    ),
    "cluster_id": Flag("cluster", str, "etcd key prefix; the file tier's subdirectory"),
    # Mooncake's DISK replicas: every put written through to a file under root_fs_dir
    # (kvcake's file tier, store/filetier.py; the master turns it on when the path is set)
    "root_fs_dir": Flag("root_fs_dir", str, "the shared file tier's root (--root-fs-dir)"),
    "quota_bytes": Flag(
        "root_fs_quota", int, "bytes of the file tier (0 = 90 percent of its filesystem)"
    ),
}
# Handled specially (see apply): they combine with other flags.
SPECIAL = {
    "enable_http_metadata_server": "bool: serve GET/PUT/DELETE /metadata (kvcake always does, on the HTTP port)",
    "http_metadata_server_port": "the HTTP port when the metadata server is enabled",
    "http_metadata_server_host": "must equal the listen address (one HTTP server)",
    "metrics_host": "must equal the listen address",
    "put_start_release_timeout_sec": "s: release = discard timeout + put_start_discard_s",
    "enable_ha": "bool: needs --etcd_endpoints (HA issue's leader election)",
}
IGNORED = {
    "rpc_thread_num", "max_threads", "rpc_conn_timeout_seconds", "rpc_enable_tcp_no_delay",
    "enable_metric_reporting", "memory_allocator", "enable_offload", "rpc_interface",
    "enable_kv_events", "allow_evict_soft_pinned_objects", "max_total_finished_tasks",
    "max_total_pending_tasks", "max_total_processing_tasks", "pending_task_timeout_sec",
    "processing_task_timeout_sec", "max_retry_attempts", "enable_metadata_cleanup_on_timeout",
    "logtostderr", "minloglevel",
    # kvcake's disk tier is each storage node's own (ssd_offload_path), promoting on hits always
    "promotion_on_hit", "promotion_max_per_heartbeat", "promotion_queue_limit",
    # the file tier: a full quota takes no more files (no eviction); capacity is root_fs_quota
    "enable_disk_eviction", "global_file_segment_size",
}  # fmt: skip


def add_gflags(
    parser: argparse.ArgumentParser, title: str, flags: dict[str, str], prefix: str = "mc_"
) -> None:
    """Declare gflags-style flags (``--name=v``, ``--name v``, ``-name=v``, a bare ``--bool``
    meaning true) under ``prefix + name``; a flag the parser already has keeps its own."""
    group = parser.add_argument_group(title, "Mooncake's names and units (docs/compat/mooncake.md)")
    taken = parser._option_string_actions
    for name, meaning in flags.items():
        names = [o for o in (f"--{name}", f"-{name}") if o not in taken]
        if names:
            group.add_argument(
                *names, dest=f"{prefix}{name}", nargs="?", const="true", default=None,
                metavar="V", help=meaning,
            )  # fmt: skip


def program_parser(
    prog: str, description: str, meanings: dict[str, str], ignored: Iterable[str]
) -> argparse.ArgumentParser:
    """The parser of one of Mooncake's programs: its flags (``meanings``) and the ones kvcake
    accepts and ignores (``ignored``), gflags-style; a misspelt one is an error (exit 2)."""
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False, description=description)
    flags = {**meanings, **dict.fromkeys(ignored, "accepted, ignored by kvcake")}
    add_gflags(p, f"{prog} flags", flags)
    return p


def given_gflags(args: argparse.Namespace, prefix: str = "mc_") -> dict[str, str]:
    """The gflags given on the command line, by Mooncake name."""
    n = len(prefix)
    return {k[n:]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None}


def parse_gflags(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args`` that names the closest known flag for a misspelt one (exit 2)."""
    # lazy: CLI start-up
    import difflib

    args, unknown = parser.parse_known_args(argv)
    if unknown:
        known = [o for o in parser._option_string_actions if o.startswith("--")]
        flag = unknown[0].split("=", 1)[0]
        close = difflib.get_close_matches("--" + flag.lstrip("-"), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        parser.error(f"unknown flag {flag!r}{hint}; see --help")
    return args


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Declare every Mooncake master flag (both ``--name`` and gflags' ``-name``)."""
    meanings = {name: FLAGS[name].meaning for name in FLAGS}
    meanings.update(SPECIAL)
    meanings.update(dict.fromkeys(sorted(IGNORED), "ignored by kvcake"))
    add_gflags(parser, "mooncake_master flags", meanings)


def apply(args: argparse.Namespace) -> None:
    """Copy the Mooncake flags given onto kvcake's dests (explicit kvcake flags win)."""
    given = given_gflags(args)
    if not given:
        return
    for name, value in given.items():
        if name in FLAGS:
            _set(args, FLAGS[name].dest, FLAGS[name].convert(value), name)
        elif name in IGNORED:
            print(f"kvcake master: --{name} has no kvcake counterpart; ignored", file=sys.stderr)
    metadata_on = boolean(given.get("enable_http_metadata_server", "false"))
    if metadata_on and "http_metadata_server_port" in given:
        port = int(given["http_metadata_server_port"])
        if "metrics_port" in given and int(given["metrics_port"]) != port:
            raise ConfigError(
                "kvcake master serves /metadata and /metrics on one HTTP port: give "
                "--http_metadata_server_port or --metrics_port, or the same value (the "
                "mooncake_master stand-in of `kvcake mooncake-shim install` serves both ports)"
            )
        _set(args, "http_port", port, "http_metadata_server_port")
    if "put_start_release_timeout_sec" in given:
        release = float(given["put_start_release_timeout_sec"])
        discard = float(given.get("put_start_discard_timeout_sec", 30))
        _set(
            args,
            "put_start_discard_s",
            max(0.0, release - discard),
            "put_start_release_timeout_sec",
        )
    if boolean(given.get("enable_ha", "false")) and not given.get("etcd_endpoints"):
        raise ConfigError("--enable_ha needs --etcd_endpoints (kvcake elects masters through etcd)")


def _set(args: argparse.Namespace, dest: str, value: Any, flag: str) -> None:
    if not hasattr(args, dest):
        raise ConfigError(f"--{flag}: kvcake master has no setting {dest!r}")
    if getattr(args, dest) is None:
        setattr(args, dest, value)
