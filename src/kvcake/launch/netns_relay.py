"""A delaying TCP relay: added latency without ``netem`` (which this kernel lacks).

``kvcake netns-relay --delay-ms D --route LISTEN=TARGET [--route ...]`` accepts
on each LISTEN (``host:port``, port 0 = free) and forwards to TARGET; every chunk read from
either side is written to the other ``D`` ms after it arrived, in order (a propagation delay:
a stream keeps its throughput, each direction gets ``D`` ms, a round trip ``2 D``). Prints
``relay on LISTEN -> TARGET`` per route once listening. The cluster harness
(:mod:`kvcake.launch.netns_cluster`) runs one on a host to delay what reaches that host's
servers. Bounded: at most ``--max-connections`` relayed connections and ``--buffer`` bytes in
flight per direction (the reader waits, as a full TCP window would).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections import deque


class _Delayed:
    """One direction of a relayed connection: chunks released ``delay_s`` after arrival."""

    def __init__(self, delay_s: float, max_bytes: int):
        self.delay_s = delay_s
        self.max_bytes = max_bytes
        self.queue: deque[tuple[float, bytes]] = deque()
        self.bytes = 0
        self.changed = asyncio.Event()

    async def pump_in(self, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(65536):
            while self.bytes >= self.max_bytes:
                self.changed.clear()
                await self.changed.wait()
            self.queue.append((time.monotonic() + self.delay_s, data))
            self.bytes += len(data)
            self.changed.set()
        self.queue.append((time.monotonic() + self.delay_s, b""))  # EOF, delayed too
        self.changed.set()

    async def pump_out(self, writer: asyncio.StreamWriter) -> None:
        while True:
            while not self.queue:
                self.changed.clear()
                await self.changed.wait()
            due, data = self.queue.popleft()
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
            self.bytes -= len(data)
            self.changed.set()


class Relay:
    def __init__(self, target: tuple[str, int], delay_s: float, max_conns: int, buffer: int):
        self.target = target
        self.delay_s = delay_s
        self.slots = asyncio.Semaphore(max_conns)
        self.buffer = buffer

    async def handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if self.slots.locked():
            cw.close()
            return
        async with self.slots:
            try:
                tr, tw = await asyncio.wait_for(asyncio.open_connection(*self.target), 10)
            except (OSError, TimeoutError):
                cw.close()
                return
            up, down = _Delayed(self.delay_s, self.buffer), _Delayed(self.delay_s, self.buffer)
            tasks = [asyncio.create_task(c) for c in (up.pump_in(cr), up.pump_out(tw),
                                                      down.pump_in(tr), down.pump_out(cw))]  # fmt: skip
            try:  # a reset on either side ends both; a clean EOF lets the other side finish
                await asyncio.gather(*tasks)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                for t in tasks:
                    t.cancel()
                for w in (cw, tw):
                    w.close()


def _hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {s!r}")
    return host, int(port)


async def serve(args: argparse.Namespace) -> None:
    servers = []
    for route in args.route:
        listen, _, target = route.partition("=")
        relay = Relay(_hostport(target), args.delay_ms / 1000, args.max_connections, args.buffer)
        srv = await asyncio.start_server(relay.handle, *_hostport(listen))
        host, port = srv.sockets[0].getsockname()[:2]
        print(f"relay on {host}:{port} -> {target} delay_ms={args.delay_ms}", flush=True)
        servers.append(srv)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for srv in servers:
        srv.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--route", action="append", required=True, help="LISTEN=TARGET, host:port")
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per direction")
    p.add_argument("--max-connections", type=int, default=1024)
    p.add_argument("--buffer", type=int, default=8 << 20, help="bytes in flight per direction")
    args = p.parse_args(argv)
    if args.delay_ms < 0 or args.max_connections < 1 or args.buffer < 65536:
        p.error("--delay-ms >= 0, --max-connections >= 1, --buffer >= 65536")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
