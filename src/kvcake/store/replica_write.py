"""Bytes into replicas (a part of :class:`~kvcake.store.puts.WritePath`): a put's values,
or a replica copy's, written into the ranges the master placed them in -- memory this process
maps (its own segment, a same-host peer's) by a copy, the rest over the network in one engine
batch -- each value's checksums taken on the way when they are still due.

Owns nothing: the client's segment views (a dict shared with it), Transfer Engine and staging
buffer come in; the staging buffer's lock is taken without waiting.
"""

from __future__ import annotations

from kvcake.core import native
from kvcake.core.clocks import boottime
from kvcake.core.errors import KvcakeError
from kvcake.store import protocol as P
from kvcake.store.errors import TransferFailed, WriteLeaseExpired
from kvcake.store.landing import LandingSums
from kvcake.store.staging import Staging
from kvcake.store.verify import write_summing
from kvcake.transfer.engine import TransferEngine

Write = tuple[str, memoryview, P.ReplicaDesc]  # (key, value, replica to write it into)
Sums = dict[str, list[int] | None]  # per key: its checksums, None while still due


class ReplicaWriter:
    """``write_all``: every (key, value, replica), the failed ones returned by key."""

    def __init__(self, segments: dict[str, memoryview], engine: TransferEngine, staging: Staging):
        self.segments, self.engine, self.staging = segments, engine, staging

    def write_all(
        self,
        writes: list[Write],
        sums: Sums | None = None,
        deadline: float = float("inf"),
    ) -> dict[str, Exception]:
        """Copy every (key, value, replica); returns the keys that failed. ``sums[key]`` None:
        the value's checksums are computed while it is copied into memory this process maps
        (its own segment, a same-host peer's: summed as it goes), and stored there. Network
        targets go through the staging buffer in one engine batch when they fit."""
        failed: dict[str, Exception] = {}
        remote = []
        for key, view, rep in writes:
            if boottime() > deadline:  # paused past its lease: the range may be another's
                failed[key] = WriteLeaseExpired(f"{key!r}: its write lease passed before its copy")
            elif rep.segment in self.segments or self.engine.reads_by_mapping(rep.segment):
                self._write_mapped(key, view, rep, sums, failed)
            else:
                remote.append((key, view, rep))
        if self.staging.fits([v.nbytes for _, v, _ in remote]) and self.staging.lock.acquire(
            blocking=False
        ):
            try:
                errs = self.staging.write([(v, r.segment, r.offset, r.fence) for _, v, r in remote])
            finally:
                self.staging.lock.release()
            failed.update({k: e for (k, _, _), e in zip(remote, errs, strict=True) if e})
            return failed
        if remote:
            failed.update(self._write_remote(remote, sums))
        return failed

    def _write_remote(
        self,
        remote: list[Write],
        sums: Sums | None,
    ) -> dict[str, Exception]:
        """Network writes as ONE engine batch (its lanes keep the link busy); sums still due
        are taken from each piece right after it is sent (store/landing.py)."""
        due = {k for k, _, _ in remote if sums and sums.get(k, []) is None}
        landings = {k: LandingSums(k, 0, v) for k, v, _ in remote if k in due}
        items = [
            (r.segment, r.offset, v, landings[k].landed if k in landings else None)
            for k, v, r in remote
        ]
        failed: dict[str, Exception] = {}
        if len(items) == 1:  # one value: the engine's inline path, no batch machinery
            try:
                self.engine.write(*items[0], fence=remote[0][2].fence)
            except KvcakeError as exc:
                failed[remote[0][0]] = exc
            return self._summed(landings, failed, sums)
        by_fence: dict[int, list[int]] = {}  # (one per master request: a put batch shares one)
        for i, (_, _, r) in enumerate(remote):
            by_fence.setdefault(r.fence, []).append(i)
        for fence, idx in by_fence.items():
            result = self.engine.write_many([items[i] for i in idx], fence)
            for i, res in zip(idx, result.results, strict=True):
                if not res.ok:
                    failed[remote[i][0]] = TransferFailed(f"{res.error_type}: {res.error}")
        return self._summed(landings, failed, sums)

    @staticmethod
    def _summed(
        landings: dict[str, LandingSums],
        failed: dict[str, Exception],
        sums: Sums | None,
    ) -> dict[str, Exception]:
        if sums is not None:
            for key, landing in landings.items():
                if key not in failed:
                    sums[key] = landing.final()
        return failed

    def _write_mapped(
        self,
        key: str,
        view: memoryview,
        rep: P.ReplicaDesc,
        sums: Sums | None,
        failed: dict[str, Exception],
    ) -> None:
        """One copy into memory this process maps, summed as it goes when the sums are due."""
        try:
            own = self.segments.get(rep.segment)
            if own is not None:
                span, check = own[rep.offset : rep.offset + view.nbytes], None
            else:
                mapped = self.engine.mapped_span(rep.segment, rep.offset, view.nbytes)
                if mapped is None:  # no longer mappable (a restarted peer): the general path
                    self.engine.write(rep.segment, rep.offset, view, fence=rep.fence)
                    return
                span, check = mapped
            if sums is not None and sums.get(key, []) is None:
                sums[key] = write_summing(key, view, span)
            else:
                native.copy(span, view)
            if check is not None:
                check()  # the owner died meanwhile: the bytes went nowhere
        except KvcakeError as exc:
            failed[key] = exc
