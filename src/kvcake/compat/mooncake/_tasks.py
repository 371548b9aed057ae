"""Mooncake's replica copy / move tasks over kvcake's two-phase replica copy.

Mooncake's master queues a task and a client's task executor runs it; here the client that
created the task runs it on one background thread of its own (``Client.copy_replica`` /
``move_replica``, store/replica_ops.py). So ``query_task`` answers for the tasks this store
object created (another client's task ids are unknown to it: -1400). The table is bounded:
at most ``MAX_PENDING`` tasks wait or run, and the oldest finished ones are forgotten past
``MAX_TASKS``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvcake.compat.mooncake._types import QueryTaskResponse, TaskStatus, TaskType
from kvcake.core.errors import KvcakeError

MAX_PENDING = 256
MAX_TASKS = 4096
TaskId = tuple[int, int]


def _now_ms() -> int:
    return int(time.time() * 1000)


class TaskTable:
    def __init__(self, client_id: TaskId) -> None:
        self._client_id = client_id
        self._lock = threading.Lock()
        self._tasks: OrderedDict[TaskId, QueryTaskResponse] = OrderedDict()
        self._pending = 0
        self._pool: ThreadPoolExecutor | None = None
        self._rng = random.Random()

    def submit(self, kind: TaskType, run: Callable[[], None]) -> TaskId | None:
        """A new task running ``run`` in the background; ``None`` when too many are pending."""
        with self._lock:
            if self._pending >= MAX_PENDING:
                return None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="mooncake-task")
            tid = (self._rng.getrandbits(63), self._rng.getrandbits(63))
            rec = QueryTaskResponse()
            rec.id, rec.type, rec.status = tid, kind, TaskStatus.PENDING
            rec.created_at_ms_epoch = rec.last_updated_at_ms_epoch = _now_ms()
            rec.assigned_client = self._client_id
            self._tasks[tid] = rec
            self._pending += 1
            self._trim()
            self._pool.submit(self._run, rec, run)
            return tid

    def _trim(self) -> None:
        done = (TaskStatus.SUCCESS, TaskStatus.FAILED)
        while len(self._tasks) > MAX_TASKS:
            old = next((k for k, r in self._tasks.items() if r.status in done), None)
            if old is None:
                return
            del self._tasks[old]

    def _set(self, rec: QueryTaskResponse, status: TaskStatus, message: str = "") -> None:
        with self._lock:
            rec.status, rec.message = status, message
            rec.last_updated_at_ms_epoch = _now_ms()

    def _run(self, rec: QueryTaskResponse, run: Callable[[], None]) -> None:
        self._set(rec, TaskStatus.PROCESSING)
        try:
            run()
        except KvcakeError as exc:
            self._set(rec, TaskStatus.FAILED, str(exc))
        except Exception as exc:  # a task never takes the executor down
            self._set(rec, TaskStatus.FAILED, f"{type(exc).__name__}: {exc}")
        else:
            self._set(rec, TaskStatus.SUCCESS)
        finally:
            with self._lock:
                self._pending -= 1

    def query(self, tid: TaskId) -> QueryTaskResponse | None:
        with self._lock:
            rec = self._tasks.get(tid)
            if rec is None:
                return None
            out = QueryTaskResponse()  # a snapshot: the record keeps changing
            out.__dict__.update(rec.__dict__)
            return out

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
