"""``kvcake bench NAME``: run ``benchmarks/NAME_bench.py`` (the reproducible performance checks;
results are recorded in docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Any

import kvcake


def benchmarks_dir() -> Path:
    # Benchmarks live in the source tree, next to src/ (kvcake is installed editable by make).
    return Path(kvcake.__file__).resolve().parents[2] / "benchmarks"


def available() -> list[str]:
    d = benchmarks_dir()
    return (
        sorted(p.name.removesuffix("_bench.py") for p in d.glob("*_bench.py")) if d.is_dir() else []
    )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="run a benchmark from benchmarks/ (transfer, store, engine, conductor, sim, e2e, all)",
        description="Run benchmarks/NAME_bench.py; extra arguments are passed to the script "
        "(e.g. `kvcake bench transfer -- --repeats 7`).",
    )
    p.add_argument("name", help=f"one of: {', '.join([*available(), 'all'])}")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark script")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    names = available() if args.name == "all" else [args.name]
    for name in names:
        script = benchmarks_dir() / f"{name}_bench.py"
        if not script.is_file():
            print(
                f"kvcake: no benchmark {name!r}; available: {', '.join(available())}",
                file=sys.stderr,
            )
            return 2
        extra = [a for a in args.args if a != "--"]
        saved = sys.argv
        sys.argv = [str(script), *extra]
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                return int(exc.code) if isinstance(exc.code, int) else 1
        finally:
            sys.argv = saved
    return 0
