"""``mooncake_master``, kvcake's stand-in: Mooncake 0.3.13's master command line, parsed as
gflags parses it (:mod:`.gflags`, every flag of :data:`.flag_catalog.MASTER`), run as a kvcake
master (``kvcake master`` with the flags :mod:`.master_flags` maps).

As Mooncake's: the RPC port is ``--rpc_port`` (0: ``--port``, 50051), ``/metrics`` is on
``--metrics_port`` (9003) and, with ``--enable_http_metadata_server``, the HTTP metadata protocol
on ``--http_metadata_server_port`` (8080) — a second HTTP server when the two ports differ.
Unlike Mooncake's, every listener binds 127.0.0.1 when the flag names every interface
(``0.0.0.0``, Mooncake's default): kvcake serves loopback unless told an address.

The program itself (it starts a master) is :mod:`kvcake.commands._mooncake_master`; this
module only turns its command line into a :class:`Plan`."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from kvcake.compat.mooncake import gflags, master_flags
from kvcake.compat.mooncake.flag_catalog import LOG_LEVEL, MASTER, common
from kvcake.core.errors import KvcakeError

PROG = "mooncake_master"
VERSION = "0.3.13.post1"  # the wheel whose flags these are
ANY = ("", "0.0.0.0", "::")
# handled here, not passed on to kvcake master's parser
OWN = {"rpc_port", "port", "rpc_address", "metrics_port", "metrics_host",
       "enable_http_metadata_server", "http_metadata_server_port", "http_metadata_server_host"}  # fmt: skip
_NOTES = {
    "rpc_port": "kvcake: the RPC port (0 = --port)",
    "port": "kvcake: the RPC port when --rpc_port is 0",
    "rpc_address": "kvcake: listen address (0.0.0.0 -> 127.0.0.1)",
    "metrics_port": "kvcake: /metrics, /health and the admin API",
    "metrics_host": "kvcake: listen address of /metrics (0.0.0.0 -> the RPC address)",
    "enable_http_metadata_server": "kvcake: serve GET/PUT/DELETE /metadata",
    "http_metadata_server_port": "kvcake: /metadata's port (a second server if not --metrics_port)",
    "http_metadata_server_host": "kvcake: /metadata's address (0.0.0.0 -> the RPC address)",
}


def catalog() -> dict[str, gflags.GFlag]:
    """Every flag the stand-in takes, with what kvcake does with it (``--help``)."""
    flags = gflags.table(MASTER, "accepted; no kvcake counterpart (ignored with a warning)")
    for name, f in flags.items():
        note = _NOTES.get(name)
        if note is None and name in master_flags.FLAGS:
            note = f"kvcake: {master_flags.FLAGS[name].meaning}"
        if note is None and name in master_flags.SPECIAL:
            note = f"kvcake: {master_flags.SPECIAL[name]}"
        if note is not None:
            flags[name] = gflags.GFlag(name, f.kind, f.default, note)
    return {**flags, **common()}


@dataclass(frozen=True)
class Plan:
    kvcake_argv: list[str]  # for `kvcake master`
    host: str
    metadata_port: int | None  # a second HTTP server's port, None: none (or the metrics port)
    log_level: int


def plan(parsed: gflags.Parsed, flags: dict[str, gflags.GFlag]) -> Plan:
    """Mooncake's settings (with Mooncake's defaults) -> kvcake master's argv."""
    val = lambda name: parsed.flag(name, flags)  # noqa: E731
    host = "127.0.0.1" if val("rpc_address") in ANY else val("rpc_address")
    rpc = int(val("rpc_port")) or int(val("port"))
    metrics = int(val("metrics_port"))
    argv = [f"--host={host}", f"--port={rpc}", f"--http-port={metrics}"]
    for name, value in parsed.values.items():
        if name in OWN or (name in flags and flags[name].note.startswith(("glog", "gflags"))):
            continue
        if (
            name in master_flags.FLAGS
            or name in master_flags.SPECIAL
            or name in master_flags.IGNORED
        ):
            argv.append(f"--{name}={value}")
        else:
            print(f"{PROG}: --{name} has no kvcake counterpart; ignored", file=sys.stderr)
    meta = None
    if gflags.to_bool(val("enable_http_metadata_server")):
        port = int(val("http_metadata_server_port"))
        meta = None if port == metrics else port
        for name in ("metrics_host", "http_metadata_server_host"):
            if val(name) not in ANY and val(name) != host:
                raise KvcakeError(f"--{name}={val(name)}: kvcake serves HTTP on the RPC address "
                                  f"{host} (--rpc_address)")  # fmt: skip
    return Plan(argv, host, meta, _log_level(parsed))


def _log_level(parsed: gflags.Parsed) -> int:
    """glog's --minloglevel (0 INFO .. 3 FATAL) and --v (> 0: verbose) as a logging level."""
    if int(parsed.values.get("v", "0")) > 0:
        return logging.DEBUG
    given = [int(parsed.values[n]) for n in LOG_LEVEL - {"v"} if n in parsed.values]
    level = min(given) if given else 1  # kvcake's programs log warnings and worse by default
    return [logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL][min(max(level, 0), 3)]
