"""``kvcake mooncake-shim install|uninstall|status``: make ``import mooncake.store`` /
``import mooncake.engine`` resolve to kvcake in this venv, undo it, or say which is active."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "mooncake-shim",
        help="make `import mooncake.store` / `mooncake.engine` use kvcake (or undo it)",
        description="Existing Mooncake integrations (vLLM's MooncakeStoreConnector, LMCache, "
        "SGLang HiCache, scripts) import mooncake.store / mooncake.engine. `install` writes a "
        "thin `mooncake` package into this interpreter's site-packages (or --target) whose "
        "modules are kvcake's; it refuses while a real Mooncake is importable, so it never "
        "shadows one. It also writes kvcake's stand-ins for Mooncake's programs "
        "(mooncake_master, mooncake_client, transfer_engine_bench) into this venv's scripts "
        "directory (or TARGET/bin), never over a program that is not kvcake's. `uninstall` "
        "removes only what the shim wrote. `status` says which `mooncake` this interpreter (or "
        "--python's) imports, any it shadows, and the programs.",
    )
    p.add_argument("action", choices=("install", "uninstall", "status"))
    p.add_argument("--target", type=Path, help="directory to write to (default: site-packages)")
    p.add_argument(
        "--python",
        help="status: the interpreter to ask (e.g. another venv's bin/python; default: this one)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up
    from kvcake.compat.mooncake import shim

    if args.action == "install":
        # lazy: CLI start-up
        from kvcake.compat.mooncake import programs

        pkg = shim.install(args.target)
        print(f"kvcake mooncake shim installed: {pkg}")
        print("  `import mooncake.store` / `import mooncake.engine` now use kvcake")
        bin_dir = programs.scripts_dir(args.target)
        print(f"  programs in {bin_dir}: {', '.join(programs.PROGRAMS)}")
        return 0
    if args.action == "uninstall":
        gone = shim.uninstall(args.target)
        print(f"kvcake mooncake shim removed: {gone}" if gone else "no kvcake mooncake shim found")
        return 0
    # lazy: CLI start-up
    from kvcake.compat.mooncake import programs

    bin_dir = programs.scripts_dir(args.target)
    if args.python:  # another interpreter: ask it (its path, its site-packages, its programs)
        cur, every = shim.imported_by(args.python)
        bin_dir = Path(args.python).parent
        print(f"python: {args.python}")
    elif args.target:
        every = shim.found([str(args.target)])
        cur = next(iter(every), None)
    else:
        cur, every = shim.active(), shim.found()
    print(f"active: {cur.describe() if cur else 'none (import mooncake fails)'}")
    for f in every[1:] if cur is not None else []:
        print(f"shadowed: {f.describe()}")
    for line in programs.status_lines(bin_dir):
        print(line)
    return 0 if cur is not None else 1
