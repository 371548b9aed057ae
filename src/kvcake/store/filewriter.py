"""The client's side of the shared file tier (store/filetier.py): a bounded background writer
of finished puts' file replicas, and the reader of file replicas.

Writes go behind the put, as in Mooncake (``Client::PutToLocalFile`` copies the value and a
thread pool stores it after the put returned): the put's latency stays that of its memory
copies. Unlike Mooncake's pool the queue is bounded (``client.file_queue_bytes``): a put waits
while it is full, so a slow filesystem slows writers instead of growing memory without end.
Each write is reported to the master (``TaskDone(kind="persist")``), which only then lets the
object's memory copies be evicted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from kvcake.core.errors import KvcakeError
from kvcake.store import protocol as P
from kvcake.store.disk import verified_value, write_object_file
from kvcake.store.errors import ChecksumMismatch, ObjectNotFound, TransferFailed
from kvcake.store.readguard import ReadGuard, commit_under

log = logging.getLogger(__name__)
Report = Callable[[str, int, bool], object]  # (key, offset, ok) -> tell the master


def read_file_ranges(
    rep: P.ReplicaDesc,
    key: str,
    size: int,
    ranges: Sequence[tuple[int, memoryview]],
    guard: ReadGuard | None = None,
    sums: Sequence[int] | None = None,
) -> None:
    """Fill each ``(offset, out)`` from the verified file of a file-tier replica. A missing
    file is ObjectNotFound, a corrupt one (header, key, length, checksums, or checksums that
    are not ``sums``, the object's) ChecksumMismatch: never bytes that were not written for
    this version of ``key``. ``sums=None``: the file's own checksums only."""
    try:
        raw = Path(rep.endpoint).read_bytes()
    except FileNotFoundError as exc:
        raise ObjectNotFound(f"{key!r}: its file {rep.endpoint} is missing") from exc
    except OSError as exc:
        raise TransferFailed(f"{key!r}: cannot read {rep.endpoint}: {exc}") from exc
    body = verified_value(raw, key, sums)
    if body.nbytes != size:
        raise ChecksumMismatch(f"{key!r}: its file holds {body.nbytes} bytes, not {size}")
    with commit_under(guard):
        for off, out in ranges:
            out[:] = body[off : off + out.nbytes]


class FileWriter:
    """One thread writing queued values to their files, then reporting each to the master."""

    def __init__(self, report: Report, max_bytes: int):
        self.report = report
        self.max_bytes = max_bytes
        self.written = 0
        self.failed = 0
        self._cv = threading.Condition()
        self._queue: deque[tuple[str, bytes, str, int, list[int]]] = deque()
        self._bytes = 0  # queued plus the one being written
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvcake-file-writer", daemon=True)
        self._thread.start()

    def submit(self, key: str, value: memoryview, rep: P.ReplicaDesc, sums: Sequence[int]) -> None:
        """Queue ``value`` (copied: the caller may reuse its buffer) for ``rep``'s file, with
        the checksums its put computed (carried into the file); waits while the queue holds
        more than ``max_bytes``."""
        data = bytes(value)
        with self._cv:
            while self._bytes and self._bytes + len(data) > self.max_bytes and not self._closed:
                self._cv.wait()
            if self._closed:
                raise TransferFailed(f"{key!r}: the file writer is closed")
            self._queue.append((key, data, rep.endpoint, rep.offset, list(sums)))
            self._bytes += len(data)
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                key, data, path, offset, sums = self._queue.popleft()
            ok = self._write(key, data, Path(path), sums)
            with contextlib.suppress(KvcakeError):  # unreported: the master gives up on it
                self.report(key, offset, ok)
            with self._cv:
                self._bytes -= len(data)
                self._cv.notify_all()

    def _write(self, key: str, data: bytes, path: Path, sums: list[int]) -> bool:
        try:
            try:
                write_object_file(path, key, memoryview(data), sums)
            except FileNotFoundError:  # its directory is gone (or not created here yet)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_object_file(path, key, memoryview(data), sums)
        except (OSError, ChecksumMismatch) as exc:  # (no sums: a put with client.verify off)
            log.warning("file tier: writing %r to %s failed: %s", key, path, exc)
            self.failed += 1
            return False
        self.written += 1
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued value is written and reported; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the thread."""
        self.flush(timeout_s)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)
