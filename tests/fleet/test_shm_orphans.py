"""Reclaiming the /dev/shm segments a killed engine leaves: only segments that appeared after
the snapshot and that no live process maps or holds open are unlinked (real files, a real
child process holding one)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from kvcake.fleet import shm_orphans

HOLD = r"""
import mmap, sys
fd = open(sys.argv[1], "r+b")
m = mmap.mmap(fd.fileno(), 4096)
print("mapped", flush=True)
sys.stdin.read()
"""


def test_only_new_unused_segments_are_reclaimed(tmp_path: Path) -> None:
    shm = tmp_path  # a directory laid out like /dev/shm (the scan of /proc is the real one)
    tag = uuid.uuid4().hex[:8]
    old = shm / f"psm_{tag}_old"
    old.write_bytes(bytes(4096))
    before = shm_orphans.segments(shm)
    assert old.name in before
    orphan, held, other = (shm / f"psm_{tag}_{n}" for n in ("orphan", "held", "other"))
    for f in (orphan, held, other):
        f.write_bytes(bytes(4096))
    (shm / f"x{tag}").write_bytes(b"")  # not a psm_ segment: never considered
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"mapped\n"
        with other.open("rb"):  # held open (not mapped) by this process
            assert held.name in shm_orphans.in_use(shm) and other.name in shm_orphans.in_use(shm)
            removed = shm_orphans.reclaim(before, shm)
        assert removed == [orphan.name]
        assert not orphan.exists() and held.exists() and other.exists() and old.exists()
    finally:
        child.communicate(b"")
    assert shm_orphans.reclaim(before, shm) == sorted([held.name, other.name])  # now unused
    assert old.exists() and (shm / f"x{tag}").exists()
