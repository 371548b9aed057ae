"""Opt-in heap tracing for leak hunts (``benchmarks/soak.py --tracemalloc DIR``).

With ``KVCAKE_TRACEMALLOC=DIR`` in its environment a serving process starts :mod:`tracemalloc`
(``KVCAKE_TRACEMALLOC_FRAMES`` frames, default 8) and writes a snapshot to
``DIR/<name>-<pid>-<n>.snap`` on every ``SIGUSR2``. :func:`diff` compares two snapshots: the
allocation sites that grew most. Off (no cost) unless the variable is set.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)
ENV = "KVCAKE_TRACEMALLOC"


def install_from_env(name: str) -> bool:
    """Start tracing and the SIGUSR2 dump if ``KVCAKE_TRACEMALLOC`` names a directory."""
    where = os.environ.get(ENV, "")
    if not where:
        return False
    out = Path(where)
    out.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(int(os.environ.get(f"{ENV}_FRAMES", "8")))
    count = itertools.count()

    def dump(_sig: int, _frame: FrameType | None) -> None:
        path = out / f"{name}-{os.getpid()}-{next(count)}.snap"
        snap = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        tmp = path.with_suffix(".part")
        snap.dump(str(tmp))
        tmp.replace(path)  # readers never see half a snapshot
        log.warning("tracemalloc snapshot written to %s", path)

    signal.signal(signal.SIGUSR2, dump)
    return True


def diff(before: str | Path, after: str | Path, top: int = 15, key: str = "traceback") -> list[str]:
    """The ``top`` allocation sites by growth from ``before`` to ``after`` (one line each, the
    innermost kvcake frame first when the traceback has one)."""
    a = tracemalloc.Snapshot.load(str(before))
    b = tracemalloc.Snapshot.load(str(after))
    lines = []
    for st in b.compare_to(a, key)[:top]:
        frames = [f for f in st.traceback if "/kvcake/" in f.filename] or list(st.traceback)
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:][::-1])
        lines.append(f"{st.size_diff / 2**20:+8.2f} MiB {st.count_diff:+8d} blocks  {where}")
    return lines
