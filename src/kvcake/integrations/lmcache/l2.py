"""kvcake as an L2 of LMCache's multi-process server (``lmcache server``): a ``native_plugin``.

LMCache wraps this object in its ``NativeConnectorL2Adapter``; configured as
``{"type": "native_plugin", "module_path": "kvcake.integrations.lmcache.l2",
"class_name": "KvcakeL2Client", "adapter_params": {"master": "127.0.0.1:50051"}}``.
The interface: ``event_fd``, ``submit_batch_get/set/exists/delete`` (return a future id at
once), ``drain_completions`` -> ``[(future_id, ok, error, per-key bools)]``, ``close``.

This path hands over key strings and byte buffers only (no dtype/shape), so each object is
``KVCAKEL2 || u64 length || bytes``; a get whose buffer length differs from the length the
header names (or from an object too short for it) fails for that key (logged, counted), and
nothing is copied into the buffer. No LMCache import:
the class is plain Python over kvcake's store client.

LMCache calls ``submit_*`` while holding its adapter's lock (native submits are meant not to
block), so a full queue fails the batch at once instead of waiting, and no exception of a job
stops the worker: every submitted id gets exactly one completion."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kvcake.store.client import Client
from kvcake.store.errors import InvalidParams, ObjectAlreadyExists, ObjectNotFound, StoreError

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<8sQ")
MAGIC = b"KVCAKEL2"
KEY_PREFIX = "lmcache-l2/"
Completion = tuple[int, bool, str, list[bool] | None]
_Job = tuple[int, Callable[[], list[bool]], bool]


class KvcakeL2Client:
    def __init__(self, master: str, protocol: str = "auto", max_pending: int = 1024):
        self.client = Client(master=master, protocol=protocol)
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs: queue.Queue[_Job | None] = queue.Queue(max_pending)
        self._done: list[Completion] = []
        self._lock = threading.Lock()
        self._next = 0
        self.errors = {"size_mismatch": 0, "store_error": 0, "queue_full": 0, "internal": 0}
        self._worker = threading.Thread(target=self._run, name="kvcake-l2", daemon=True)
        self._worker.start()

    def event_fd(self) -> int:
        return self._efd

    def _submit(self, job: Callable[[], list[bool]], all_or_none: bool = False) -> int:
        """Queue ``job`` (per-key results); ``all_or_none``: the batch fails unless every key
        succeeded (stores: LMCache's adapter reads only the batch's flag for them)."""
        with self._lock:
            self._next += 1
            fid = self._next
        try:
            self._jobs.put_nowait((fid, job, all_or_none))
        except queue.Full:  # bounded, and never blocking LMCache's adapter lock
            self.errors["queue_full"] += 1
            log.warning("kvcake L2: %d batches pending, batch %d refused", self._jobs.qsize(), fid)
            self._complete((fid, False, "kvcake L2: queue full", None))
        return fid

    def _complete(self, done: Completion) -> None:
        with self._lock:
            self._done.append(done)
        os.eventfd_write(self._efd, 1)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            fid, job, all_or_none = item
            try:
                results = job()
                failed = results.count(False) if all_or_none else 0
                error = f"{failed} of {len(results)} keys failed" if failed else ""
                done: Completion = (fid, not failed, error, results)
            except StoreError as e:  # a whole-call failure (e.g. the master unreachable)
                done = (fid, False, str(e), None)
            except Exception as e:  # a bad key, a bug: fail this batch, keep the worker alive
                self.errors["internal"] += 1
                log.exception("kvcake L2 batch %d failed", fid)
                done = (fid, False, f"{type(e).__name__}: {e}", None)
            self._complete(done)

    def drain_completions(self) -> list[Completion]:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        with self._lock:
            done, self._done = self._done, []
        return done

    def submit_batch_set(self, keys: Sequence[str], buffers: Sequence[Any]) -> int:
        views = [memoryview(b).cast("B") for b in buffers]
        if len(views) != len(keys):
            raise ValueError(f"{len(keys)} keys, {len(views)} buffers")
        return self._submit(
            lambda: [self._set(k, v) for k, v in zip(keys, views, strict=True)], all_or_none=True
        )

    def _set(self, key: str, view: memoryview) -> bool:
        try:
            self.client.put(KEY_PREFIX + key, _HEAD.pack(MAGIC, len(view)) + view)
        except ObjectAlreadyExists:  # content-addressed: the same bytes are there
            pass
        except StoreError as e:  # e.g. no space: this key is not stored, the others may be
            self.errors["store_error"] += 1
            log.error("kvcake L2 put %s (%d bytes): %s", key, len(view), e)
            return False
        return True

    def submit_batch_get(self, keys: Sequence[str], buffers: Sequence[Any]) -> int:
        views = [memoryview(b).cast("B") for b in buffers]
        if len(views) != len(keys):
            raise ValueError(f"{len(keys)} keys, {len(views)} buffers")
        return self._submit(lambda: self._get(list(keys), views))

    def _get(self, keys: list[str], views: list[memoryview]) -> list[bool]:
        """Two batched reads (one master lookup each): every object's header, then the payload
        of those whose header fits their buffer, scattered straight into it (no staging copy
        where the pool's memory is mapped). A buffer is written only after its header fit."""
        names = [KEY_PREFIX + k for k in keys]
        heads = [bytearray(_HEAD.size) for _ in keys]
        got = self.client.batch_get_into_ranges(names, [[(0, h)] for h in heads])
        fits = [i for i, g in enumerate(got) if self._fits(keys[i], g, heads[i], len(views[i]))]
        ok = [False] * len(keys)
        if not fits:
            return ok
        body = self.client.batch_get_into_ranges(
            [names[i] for i in fits], [[(_HEAD.size, views[i])] for i in fits]
        )
        for i, g in zip(fits, body, strict=True):
            ok[i] = self._fits(keys[i], g, None, len(views[i]))
        return ok

    def _fits(self, key: str, got: int | StoreError, head: bytearray | None, size: int) -> bool:
        """A read's outcome: ``head`` (the header read) must name ``size`` bytes of ours."""
        if isinstance(got, ObjectNotFound):
            return False
        if isinstance(got, InvalidParams) or (
            head is not None and _HEAD.unpack(head) != (MAGIC, size)
        ):  # InvalidParams: the object is shorter than the header or than this buffer
            self.errors["size_mismatch"] += 1
            log.error("kvcake L2 get %s: stored object does not fit a %d-byte buffer", key, size)
            return False
        if isinstance(got, StoreError):
            self.errors["store_error"] += 1
            log.error("kvcake L2 get %s: %s", key, got)
            return False
        return True

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        return self._submit(lambda: self.client.batch_is_exist([KEY_PREFIX + k for k in keys]))

    def submit_batch_delete(self, keys: Sequence[str]) -> int:
        return self._submit(
            lambda: [r is None for r in self.client.batch_remove([KEY_PREFIX + k for k in keys])]
        )

    def close(self) -> None:
        self._jobs.put(None)  # after the queued batches (LMCache has stopped submitting)
        self._worker.join(10)
        self.client.close()
        os.close(self._efd)
