"""``mooncake_master``, kvcake's stand-in: Mooncake 0.3.13's master command line, parsed as
gflags parses it (:mod:`.gflags`, every flag of :data:`.flag_catalog.MASTER`), run as a kvcake
master (``kvcake master`` with the flags :mod:`.master_flags` maps).

As Mooncake's: the RPC port is ``--rpc_port`` (0: ``--port``, 50051), ``/metrics`` is on
``--metrics_port`` (9003) and, with ``--enable_http_metadata_server``, the HTTP metadata protocol
on ``--http_metadata_server_port`` (8080) — a second HTTP server when the two ports differ.
Unlike Mooncake's, every listener binds 127.0.0.1 when the flag names every interface
(``0.0.0.0``, Mooncake's default): kvcake serves loopback unless told an address."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import Any

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


def main(argv: list[str] | None = None) -> int:
    flags = catalog()
    try:
        parsed = gflags.parse(flags, sys.argv[1:] if argv is None else argv)
        if any(gflags.to_bool(parsed.values.get(h, "false")) for h in ("help", "helpfull")):
            raise gflags.GFlagsExit(1, gflags.help_text(PROG, {PROG: flags}), to_stdout=True)
        if gflags.to_bool(parsed.values.get("version", "false")):
            raise gflags.GFlagsExit(0, f"{PROG} version {VERSION} (kvcake)", to_stdout=True)
        p = plan(parsed, flags)
    except gflags.GFlagsExit as stop:
        return stop.exit()
    except (KvcakeError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=p.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _run(p)
    except KvcakeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(p: Plan) -> int:
    from kvcake.cli import build_parser
    from kvcake.commands._common import serve_until_signal
    from kvcake.commands.store import _load
    from kvcake.core import auth
    from kvcake.store.config import MasterConfig
    from kvcake.store.ha.config import HaConfig
    from kvcake.store.master_server import Master

    args: argparse.Namespace = build_parser().parse_args(["master", *p.kvcake_argv])
    auth.setup_process(args.auth_secret_file, None)
    master_flags.apply(args)
    cfg, ha = _load(args, MasterConfig, "master"), _load(args, HaConfig, "ha")
    if ha.enabled:
        if p.metadata_port is not None:
            raise KvcakeError("with --enable_ha, give --http_metadata_server_port the value of "
                              "--metrics_port (kvcake's HA master serves both on one port)")  # fmt: skip
        from kvcake.commands._ha_master import run_master

        return run_master(cfg, ha)
    server = _WithMetadata(Master(cfg, cluster=ha.cluster), p.host, p.metadata_port)
    return serve_until_signal(server, "master", server.ready_line)


class _WithMetadata:
    """The master, plus Mooncake's HTTP metadata server on a port of its own when asked."""

    def __init__(self, master: Any, host: str, port: int | None):
        self.master, self.host, self.port = master, host, port
        self.http: Any = None

    def start(self) -> None:
        self.master.start()
        if self.port is not None:
            from fastapi import FastAPI

            from kvcake.store.httpserve import HttpThread
            from kvcake.store.metadata_http import metadata_router

            app = FastAPI(title="kvcake metadata", docs_url=None, redoc_url=None, openapi_url=None)
            app.include_router(metadata_router(self.master.metadata_kv))
            self.http = HttpThread(app, self.host, self.port, "metadata-http", self.master.auth)
            self.http.start()

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
        self.master.stop()

    def ready_line(self) -> str:
        m = self.master
        meta = self.http.address if self.http is not None else m.http_address
        return (f"master rpc={m.rpc_address} directory={m.directory_address} "
                f"http={m.http_address} events={m.events_address} metadata={meta}")  # fmt: skip
