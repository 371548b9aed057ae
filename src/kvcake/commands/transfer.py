"""``kvcake transfer-server`` (a Transfer Engine process, optionally hosting the directory) and
``kvcake transfer cleanup`` (remove shared-memory files left by dead processes)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvcake.commands._common import wait_for_signal
from kvcake.core import auth
from kvcake.core.config import load_config, parse_size
from kvcake.core.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "transfer-server",
        help="run a Transfer Engine process that exposes segments (optionally the directory)",
        description="Run a Transfer Engine with a transfer server on every --listen-hosts "
        "address and expose --segment NAME:SIZE segments to peers. With --metadata it also "
        "hosts the DirectoryService (the one metadata service) on --metadata-host/--port. "
        "Prints one JSON line with the addresses when ready; SIGTERM/SIGINT stop it cleanly.",
    )
    p.add_argument("--metadata", action="store_true", help="also host the DirectoryService")
    p.add_argument("--metadata-host", default="127.0.0.1", help="directory listen host")
    p.add_argument("--metadata-port", type=int, default=0, help="directory port (0: any free)")
    p.add_argument("--directory", help="host:port of an existing DirectoryService")
    p.add_argument("--hostname", default="127.0.0.1", help="host name advertised to peers")
    p.add_argument(
        "--listen-hosts", default="127.0.0.1", help="comma-separated listen addresses (NICs)"
    )
    p.add_argument(
        "--segment",
        action="append",
        default=[],
        metavar="NAME:SIZE",
        help="allocate a segment, e.g. pool:64MiB (repeatable)",
    )
    p.add_argument(
        "--memory",
        choices=("shm", "heap"),
        default="shm",
        help="segments in /dev/shm (peers on this host may map them) or in process memory",
    )
    p.add_argument("--config", help="TOML file with a [transfer] section")
    p.add_argument("--io-timeout-s", type=float, help="override transfer.io_timeout_s")

    auth.add_cli_args(p)
    p.set_defaults(func=_server)

    t = sub.add_parser("transfer", help="Transfer Engine maintenance")
    tsub = t.add_subparsers(dest="transfer_cmd", metavar="ACTION", required=True)
    c = tsub.add_parser(
        "cleanup",
        help="remove /dev/shm segment files of dead processes",
        description="Remove kvcake segment files in /dev/shm whose owner process is gone "
        "(detected by the owner's file lock, so files of live processes are never touched).",
    )
    c.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    c.set_defaults(func=_cleanup)


def _parse_segments(specs: list[str]) -> list[tuple[str, int]]:
    out = []
    for spec in specs:
        name, sep, size = spec.rpartition(":")
        if not sep or not name:
            raise ConfigError(f"--segment must be NAME:SIZE, got {spec!r}")
        n = parse_size(size)
        if n <= 0:
            raise ConfigError(f"--segment {spec!r}: size must be > 0")
        out.append((name, n))
    return out


def _server(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.transfer import DirectoryService, TransferConfig, TransferEngine

    cfg = load_config(
        TransferConfig,
        toml_path=args.config,
        section="transfer",
        overrides={"io_timeout_s": args.io_timeout_s},
    )
    segments = _parse_segments(args.segment)
    if not args.metadata and not args.directory:
        raise ConfigError("give --directory HOST:PORT or --metadata to host the directory")
    hosts = tuple(h.strip() for h in args.listen_hosts.split(",") if h.strip())
    svc = None
    if args.metadata:
        svc = DirectoryService(args.metadata_host, args.metadata_port)
        svc.start()
    directory = args.directory or (svc.address if svc else None)
    engine = TransferEngine(directory, args.hostname, hosts, config=cfg)
    heap: list[bytearray] = []
    try:
        for name, size in segments:
            if args.memory == "shm":
                engine.allocate_segment(name, size)
            else:
                heap.append(bytearray(size))
                engine.register_memory(name, heap[-1])
        ready = {
            "directory": directory,
            "addresses": engine.addresses,
            "owner": engine.owner,
            "segments": [n for n, _ in segments],
        }
        print(json.dumps(ready), flush=True)
        wait_for_signal(0.5)
    finally:
        engine.close()
        if svc is not None:
            svc.stop()
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.transfer.shm import SHM_DIR, cleanup_stale

    removed = cleanup_stale(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for p in removed:
        print(f"{verb} {p}")
    print(f"{verb} {len(removed)} stale segment file(s) in {SHM_DIR}", file=sys.stderr)
    return 0
