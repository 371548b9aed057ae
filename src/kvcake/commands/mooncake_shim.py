"""``kvcake mooncake-shim install|uninstall|status``: make ``import mooncake.store`` /
``import mooncake.engine`` resolve to kvcake in this venv, undo it, or say which is active."""

from __future__ import annotations

import argparse
import sys
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
        "shadows one. `uninstall` removes only the shim. `status` says which is active.",
    )
    p.add_argument("action", choices=("install", "uninstall", "status"))
    p.add_argument("--target", type=Path, help="directory to write to (default: site-packages)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from kvcake.compat.mooncake import shim

    if args.action == "install":
        pkg = shim.install(args.target)
        print(f"kvcake mooncake shim installed: {pkg}")
        print("  `import mooncake.store` / `import mooncake.engine` now use kvcake")
        return 0
    if args.action == "uninstall":
        gone = shim.uninstall(args.target)
        print(f"kvcake mooncake shim removed: {gone}" if gone else "no kvcake mooncake shim found")
        return 0
    paths = [str(args.target)] if args.target else None
    cur = shim.active() if paths is None else next(iter(shim.found(paths)), None)
    print(f"active: {cur.describe() if cur else 'none (import mooncake fails)'}")
    for f in shim.found(paths)[1:]:
        print(f"shadowed: {f.describe()}")
    return 0 if cur is not None else 1


if __name__ == "__main__":
    sys.exit(0)
