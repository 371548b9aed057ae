"""``mooncake_client`` (kvcake's stand-in, written by ``kvcake mooncake-shim install``): Mooncake's
standalone real client as a kvcake storage node. It connects to the master, mounts
``--global_segment_size`` bytes into the pool, serves ``/health`` and ``/metrics`` on
a free port (``--http_port`` with ``--enable_http_server``), serves dummy clients
(``setup_dummy``) on ``127.0.0.1:--port`` (``real_client_ipc``) and runs until SIGTERM/SIGINT
(then unmounts).

Like Mooncake's (which retries its setup 20 times, about 90 s, then aborts), it waits for a master
that is not up yet, but only so long: ``KVCAKE_MOONCAKE_CLIENT_CONNECT_S`` seconds (default 20),
then exits 1 with the reason (docs/compat/mooncake.md)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from kvcake.compat.mooncake.gflags import GFlagsExit
from kvcake.compat.mooncake.real_client_flags import PROG, parse
from kvcake.compat.mooncake.real_client_ipc import DummyServer
from kvcake.core.errors import KvcakeError
from kvcake.store.config import StoreServerConfig
from kvcake.store.server import StoreServer

CONNECT_ENV = "KVCAKE_MOONCAKE_CLIENT_CONNECT_S"
RETRY_S = 0.5
GRACE_S = 10.0  # one attempt hanging past the deadline (a master that never answers): give up


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s %(message)s")
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        connect_s = float(os.environ.get(CONNECT_ENV, "20"))
    except GFlagsExit as ended:  # gflags' own errors, help and version: its words and status
        return ended.exit()
    except (KvcakeError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = connect(args.store, connect_s, stop)
    except OSError as exc:
        print(f"{PROG}: error: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 2
    except KvcakeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    if server is None:
        return 0  # stopped while waiting for the master
    assert server.client is not None
    try:
        dummies = DummyServer(server.client, args.port)
    except OSError as exc:
        server.stop()
        print(f"{PROG}: error: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(f"{PROG}: Starting real client service on {dummies.address}", file=sys.stderr)
    print(
        f"{PROG} segment={server.segment_name} size={args.store.segment_size} "
        f"port={dummies.address} http={server.http_address} master={args.store.master}",
        flush=True,
    )
    try:
        while not stop.wait(0.05):
            pass
    finally:
        dummies.stop()
        server.stop()
    return 0


def connect(cfg: StoreServerConfig, connect_s: float, stop: threading.Event) -> StoreServer | None:
    """A started storage node, retrying an unreachable master for ``connect_s`` seconds (then the
    last error is raised); None if ``stop`` is set first. A watchdog bounds a hanging attempt."""
    deadline = time.monotonic() + connect_s
    watchdog = threading.Timer(connect_s + GRACE_S, _give_up, (cfg.master, connect_s))
    watchdog.daemon = True
    watchdog.start()
    try:
        while True:
            server = StoreServer(cfg)
            try:
                server.start()
                return server
            except KvcakeError as exc:
                server.stop()
                if time.monotonic() + RETRY_S > deadline:
                    raise KvcakeError(
                        f"cannot reach the master at {cfg.master} within {connect_s:g} s: {exc}"
                    ) from exc
                logging.getLogger(PROG).info("master not reachable yet: %s", exc)
            except BaseException:
                server.stop()
                raise
            if stop.wait(RETRY_S):
                return None
    finally:
        watchdog.cancel()


def _give_up(master: str, connect_s: float) -> None:
    msg = f"{PROG}: error: no answer from the master at {master} within {connect_s:g} s"
    print(msg, file=sys.stderr, flush=True)
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
