"""POSIX shared-memory segments that a killed vLLM engine leaves in ``/dev/shm``.

vLLM's message queues between its API server, engine core and workers live in
``multiprocessing.shared_memory`` segments (``/dev/shm/psm_*``, 160-240 MB each on this
machine). Their creator unlinks them on a clean exit; a SIGKILLed process group never does,
so every crash of a supervised engine used to leak ~420 MB of RAM-backed files.

The engine's segments cannot be told apart by name, so a segment is reclaimed only when it
appeared after the engine started (``created_since``) *and* no live process maps it or holds
it open (``/proc/*/maps`` and ``/proc/*/fd``): another live engine's queues, or anybody
else's segment in use, are never touched.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "psm_"  # multiprocessing.shared_memory's generated names


def segments(shm_dir: Path = SHM_DIR) -> frozenset[str]:
    """The names of the ``psm_*`` segments that exist now."""
    with contextlib.suppress(OSError):
        return frozenset(p.name for p in shm_dir.glob(PREFIX + "*"))
    return frozenset()


def in_use(shm_dir: Path = SHM_DIR) -> frozenset[str]:
    """``psm_*`` segments some live process maps or holds open (processes that exit during
    the scan are skipped: what they held is no longer in use)."""
    prefix = str(shm_dir / PREFIX)
    busy: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                i = line.find(prefix)
                if i >= 0:
                    busy.add(os.path.basename(line[i:].split()[0]))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(prefix):
                        busy.add(os.path.basename(target))
    return frozenset(busy)


def reclaim(created_since: frozenset[str], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the segments that did not exist in ``created_since`` (a snapshot taken before the
    engine started) and that nobody uses now; returns their names."""
    fresh = segments(shm_dir) - created_since
    if not fresh:
        return []
    removed = []
    for name in sorted(fresh - in_use(shm_dir)):
        with contextlib.suppress(FileNotFoundError):
            (shm_dir / name).unlink()
            removed.append(name)
    return removed
