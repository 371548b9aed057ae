"""The ``kvcake`` command. Sub-commands live one module each in :mod:`kvcake.commands`; every
module there defines ``register(subparsers)`` and is discovered automatically, and imports its
heavy dependencies (torch, the simulator...) only inside its handler so ``--help`` stays fast."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence

import kvcake.commands as pkg
from kvcake import __version__
from kvcake.core import auth
from kvcake.core.errors import KvcakeError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcake",
        description="KV-cache-centric, prefill/decode disaggregated LLM serving (Mooncake in Python).",
    )
    parser.add_argument("--version", action="version", version=f"kvcake {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"kvcake.commands.{info.name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if not sys.stdout.isatty():  # rich cuts tables to 80 columns when piped or logged
        os.environ.setdefault("COLUMNS", "200")
    try:
        if hasattr(args, "auth_secret_file"):  # commands that serve: the shared secret
            auth.setup_process(args.auth_secret_file, getattr(args, "config", None))
        return int(args.func(args) or 0)
    except KvcakeError as exc:
        print(f"kvcake: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
