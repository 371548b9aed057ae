"""``mooncake_master``, kvcake's stand-in program (``kvcake mooncake-shim install`` writes it):
Mooncake's master command line (:mod:`kvcake.compat.mooncake.master_program` turns it into a
:class:`~kvcake.compat.mooncake.master_program.Plan`), run as a kvcake master."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from fastapi import FastAPI

from kvcake.commands import store
from kvcake.commands._common import serve_until_signal
from kvcake.commands._ha_master import run_master
from kvcake.compat.mooncake import gflags, master_flags
from kvcake.compat.mooncake.master_program import PROG, VERSION, Plan, catalog, plan
from kvcake.core import auth
from kvcake.core.errors import KvcakeError
from kvcake.net.httpserve import HttpThread
from kvcake.store.config import MasterConfig
from kvcake.store.ha.config import HaConfig
from kvcake.store.master_server import Master
from kvcake.store.metadata_http import metadata_router


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
    parser = argparse.ArgumentParser(prog="kvcake")
    store.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["master", *p.kvcake_argv])
    auth.setup_process(args.auth_secret_file, None)
    master_flags.apply(args)
    cfg, ha = store._load(args, MasterConfig, "master"), store._load(args, HaConfig, "ha")
    if ha.enabled:
        if p.metadata_port is not None:
            raise KvcakeError("with --enable_ha, give --http_metadata_server_port the value of "
                              "--metrics_port (kvcake's HA master serves both on one port)")  # fmt: skip

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
