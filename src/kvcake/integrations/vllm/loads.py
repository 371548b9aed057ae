"""Pool loads into vLLM's paged KV: one step's loads, whole or layer group by layer group.

vLLM calls ``start_load_kv`` before the forward, ``wait_for_layer_load(layer)`` as each
attention layer starts, and ``wait_for_save`` after it. A load runs on the loader thread; the
forward waits for it, bounded by ``load_timeout_s`` (one deadline for the whole load).

* **Whole** (``layer_groups`` = 1, or a GPU engine staging through host memory): every layer is
  read before ``start_load_kv`` returns.
* **Layer-wise** (``layer_groups`` > 1, host KV read in place): the layers are cut into
  contiguous groups in forward order, each read as one ``batch_get_into_ranges`` of its planes'
  byte ranges, and a layer waits only for its own group: the first layers compute while the
  later ones still load.

On an error or the deadline the guard is cancelled (no byte lands in vLLM's blocks any more),
the groups not started are dropped, and every block of the load is reported for recompute.
*Any* exception of a load (a store error, a broken connection, a bug) ends there: it never
reaches vLLM's forward, it only turns the load's blocks into recomputed ones. A block whose
read failed (a missing object, a checksum mismatch: the store verifies each chunk a read
covers before it reports success) is reported with the rest of its request's run.
Invariant: :meth:`PendingLoad.finish` runs before vLLM asks for the step's load errors; a group
the forward never waited for (an attention backend without vLLM's per-layer hook) may have been
read half-loaded, so then every block is reported too and the loader goes back to whole loads.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from kvcake.core.errors import KvcakeError, StoreError
from kvcake.core.pools import started_pool
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.paged import PagedKV
from kvcake.integrations.vllm.plan import BlockRun
from kvcake.integrations.vllm.pool import PoolHandle
from kvcake.integrations.vllm.worker import Counters
from kvcake.store.readguard import ReadGuard

GroupResult = tuple[list[Any], float]  # per key: bytes read or its StoreError; when it ended


def _timed(call: Callable[[], list[Any]]) -> GroupResult:
    return call(), time.perf_counter()


def failed_blocks(runs: Sequence[BlockRun], bad: Sequence[bool]) -> set[int]:
    """A run is a request's leading blocks: from its first bad block on, vLLM recomputes."""
    failed: set[int] = set()
    pos = 0
    for run in runs:
        broken = False
        for i, block in enumerate(run.block_ids):
            broken = broken or bad[pos + i]
            if broken:
                failed.add(block)
        pos += len(run.block_ids)
    return failed


class PendingLoad:
    """One step's load. Owned by the worker thread that runs the forward; the loader thread
    only fills the futures."""

    def __init__(self, runs: Sequence[BlockRun], futures: list[cf.Future[GroupResult]],
                 group_of: dict[str, int], guard: ReadGuard, deadline: float, t0: float,
                 loader: Loader, after: Callable[[list[bool]], None] | None = None,
                 error: BaseException | None = None):  # fmt: skip
        self.runs, self.futures, self.group_of = runs, futures, group_of
        self.ids = [b for r in runs for b in r.block_ids]
        self.guard, self.deadline, self.t0, self.loader = guard, deadline, t0, loader
        self.after = after  # staged (GPU) loads: scatter the rows that arrived
        self.results: dict[int, GroupResult] = {}
        self.waited: set[int] = set()
        self.error = error  # set: the load failed (all its blocks are recomputed)
        self.wait_s = 0.0

    def wait_layer(self, layer: str) -> None:
        """Block until ``layer``'s group has landed (or the load failed)."""
        g = self.group_of.get(layer)
        if g is not None:
            self.waited.add(g)
            self._wait(g)

    def _wait(self, g: int) -> None:
        if self.error is not None or g in self.results:
            return
        t = time.perf_counter()
        try:
            self.results[g] = self.futures[g].result(max(0.0, self.deadline - time.monotonic()))
        except cf.TimeoutError:
            self._give_up(TimeoutError(f"deadline {self.loader.cfg.load_timeout_s} s"))
            self.loader.counters.add(load_deadline_misses=1)
        except Exception as exc:  # whatever it is, vLLM recomputes; the forward never sees it
            self._give_up(exc)
        finally:
            self.wait_s += time.perf_counter() - t

    def _give_up(self, exc: BaseException) -> None:
        # vLLM will recompute into these blocks: once the guard is cancelled no late byte can
        # land there (cancel waits out a copy in progress at most).
        self.guard.cancel()
        for f in self.futures:
            f.cancel()
        self.error = exc
        self.loader.pool.failed("load", exc)

    def _good(self, got: Any) -> bool:
        """A key's result is usable: bytes read, and for a staged (whole) read all of them
        (an object of another size is not this block)."""
        if isinstance(got, StoreError) or not isinstance(got, int):
            return False
        return self.after is None or got == self.loader.block_bytes

    def failed_requests(self, failed: set[int]) -> set[str]:
        """The requests of this load with a block in ``failed``."""
        return {r.req_id for r in self.runs if not failed.isdisjoint(r.block_ids)}

    def finish(self) -> set[int]:
        """Join what is left; return the block ids vLLM must recompute."""
        for g in range(len(self.futures)):
            self._wait(g)
        n = len(self.ids)
        if n == 0:
            return set()
        if self.error is not None:
            self.loader.counters.add(load_error_blocks=n, load_wait_seconds=self.wait_s)
            return set(self.ids)
        if len(self.futures) > 1 and len(self.waited) < len(self.futures):
            self.loader.unhooked(len(self.futures) - len(self.waited))
            self.loader.counters.add(load_error_blocks=n, load_wait_seconds=self.wait_s)
            return set(self.ids)
        bad = [any(not self._good(r[0][i]) for r in self.results.values()) for i in range(n)]
        failed = failed_blocks(self.runs, bad)
        if failed:
            first = next(x for r in self.results.values() for x in r[0] if not self._good(x))
            self.loader.pool.log.warning(
                "kvcake: %d of %d pooled blocks could not be loaded (%s); vLLM recomputes them",
                len(failed), n, first,
            )  # fmt: skip
        ok = [b not in failed for b in self.ids]
        if self.after is not None:
            try:
                self.after(ok)
            except Exception as exc:
                self._give_up(exc)
                self.loader.counters.add(load_error_blocks=n, load_wait_seconds=self.wait_s)
                return set(self.ids)
        loaded = sum(ok)
        self.loader.counters.add(
            load_blocks=loaded,
            load_bytes=loaded * self.loader.block_bytes,
            load_seconds=max(r[1] for r in self.results.values()) - self.t0,
            load_error_blocks=len(failed),
            load_wait_seconds=self.wait_s,
        )
        return failed


class Loader:
    """Starts loads on one background thread. A load still running past its deadline makes
    the next ones fail fast (the store hangs; vLLM recomputes) until it ends."""

    def __init__(self, pool: PoolHandle, counters: Counters, cfg: ConnectorConfig):
        self.pool, self.counters, self.cfg = pool, counters, cfg
        self.layer_groups = cfg.load_layer_groups
        self.block_bytes = 0
        self._exec = started_pool(1, "kvcake-load")
        self._inflight: list[cf.Future[Any]] = []  # the last load's (cancelled ones are done)

    def start(
        self, paged: PagedKV, runs: Sequence[BlockRun], name: Callable[[str], str] = str
    ) -> PendingLoad:
        """Start one step's load of ``runs`` (the pool object of planned key ``k`` is
        ``name(k)``: this worker's rank's); never raises (a load that cannot start fails every
        block)."""
        try:
            return self._start(paged, runs, name)
        except Exception as exc:
            load = PendingLoad(runs, [], {}, ReadGuard(), time.monotonic(), time.perf_counter(),
                               self, error=exc)  # fmt: skip
            self.pool.failed("load", exc)
            return load

    def _start(
        self, paged: PagedKV, runs: Sequence[BlockRun], name: Callable[[str], str]
    ) -> PendingLoad:
        keys = [name(k) for r in runs for k in r.keys]
        ids = [b for r in runs for b in r.block_ids]
        self.block_bytes = paged.block_bytes
        t0 = time.perf_counter()
        guard = ReadGuard()
        deadline = time.monotonic() + self.cfg.load_timeout_s
        if not keys:
            return PendingLoad(runs, [], {}, guard, deadline, t0, self)
        client = self.pool.client()
        if client is None or any(not f.done() for f in self._inflight):
            # No pool, or the previous load still hangs past its deadline: fail fast.
            gone = KvcakeError("no pool, or the last load still hangs")
            return PendingLoad(runs, [], {}, guard, deadline, t0, self, error=gone)

        if not paged.direct:  # GPU: through a host staging buffer, then one scatter
            return self._staged(paged, runs, keys, ids, client, guard, deadline, t0)
        groups = paged.layer_groups(self.layer_groups)
        futures: list[cf.Future[GroupResult]] = []
        for layers in groups:
            planes = [p for name in layers for p in paged.layer_planes[name]]
            dests = paged.tables(ids, planes if len(groups) > 1 else None)
            call = partial(client.batch_get_into_ranges, keys, dests, guard)
            futures.append(self._exec.submit(_timed, call))
        self._inflight = futures
        group_of = {name: g for g, layers in enumerate(groups) for name in layers}
        return PendingLoad(runs, futures, group_of if len(groups) > 1 else {}, guard, deadline,
                           t0, self)  # fmt: skip

    def _staged(self, paged: PagedKV, runs: Sequence[BlockRun], keys: list[str], ids: list[int],
                client: Any, guard: ReadGuard, deadline: float, t0: float) -> PendingLoad:  # fmt: skip
        """A device KV cache: read into a host buffer of its own (a load that overran writes
        nowhere vLLM reads), scatter the rows that arrived once it is joined."""
        buf = paged.empty(len(keys))
        future = self._exec.submit(_timed, partial(client.batch_get_into, keys, list(buf)))

        def scatter(ok: list[bool]) -> None:
            rows = [i for i, good in enumerate(ok) if good]
            if rows:
                idx = torch.tensor(rows, dtype=torch.long)
                paged.scatter([ids[i] for i in rows], buf.index_select(0, idx))

        self._inflight = [future]
        return PendingLoad(runs, [future], {}, guard, deadline, t0, self, scatter)

    def unhooked(self, groups: int) -> None:
        """The forward ran without waiting for ``groups`` layer groups: load whole from now on."""
        if self.layer_groups > 1:
            self.pool.log.warning(
                "kvcake: vLLM's forward did not wait for %d layer group(s) of a layer-wise load "
                "(no per-layer hook in this attention backend?); the load's blocks are "
                "recomputed and later loads read every layer before the forward", groups,
            )  # fmt: skip
        self.layer_groups = 1

    def close(self) -> None:
        self._exec.shutdown(wait=False, cancel_futures=True)
