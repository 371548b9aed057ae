"""The catalog's bookkeeping of fragment lifetimes (references from rows, pinned readers,
retirement of managed fragments and the acknowledgement of their cleanup, the terminal drain)
and of publications (the first answer per operation id)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvcake.compat.mooncake._structured import _catalog_util as U


class Lifetimes:
    """Owns every fragment's canonical handle, its reference count (row fields pointing into it),
    its pinned readers, and the retired handles awaiting ``ack_retired``. A fragment retires
    when neither rows nor pinned reads use it; only managed ones are handed back. No lock: the
    catalog's host serializes its calls."""

    def __init__(self) -> None:
        self._fragments: dict[str, dict[str, Any]] = {}  # fragment id -> canonical handle
        self._refcounts: dict[str, int] = {}  # row fields pointing into a fragment
        self._managed: set[str] = set()
        self._readers: dict[str, int] = {}  # pinned reads using a fragment
        self._pins: dict[int, tuple[str, ...]] = {}
        self._next_token = 0
        self._retired: dict[str, dict[str, Any]] = {}  # awaiting ack_retired
        self.drained = False  # terminal: the catalog takes no more updates

    def handle(self, fid: str) -> dict[str, Any] | None:
        """The fragment's canonical handle (not a copy), None if it is not live."""
        return self._fragments.get(fid)

    def handles(self, fids: set[str]) -> dict[str, dict[str, Any]]:
        return {fid: copy.deepcopy(self._fragments[fid]) for fid in fids}

    def is_managed(self, fid: str) -> bool:
        return fid in self._managed

    def is_retiring(self, fid: str) -> bool:
        return fid in self._retired

    def register(self, fid: str, canonical: dict[str, Any], managed: bool) -> None:
        """A fragment rows may point into (known already: unchanged)."""
        self._fragments.setdefault(fid, canonical)
        self._refcounts.setdefault(fid, 0)
        if managed:
            self._managed.add(fid)

    def replace(self, fid: str, canonical: dict[str, Any]) -> None:
        """A live fragment's handle after an append (the same rows with more fields)."""
        self._fragments[fid] = canonical

    def ref(self, fid: str) -> None:
        self._refcounts[fid] += 1

    def retired_result(self) -> dict[str, Any]:
        return {"retired_handles": [copy.deepcopy(h) for h in self._retired.values()]}

    def drop(self, fid: str) -> None:
        left = self._refcounts[fid] - 1
        if left:
            self._refcounts[fid] = left
            return
        del self._refcounts[fid]
        if not self._readers.get(fid, 0):
            self._retire(fid)

    def _retire(self, fid: str) -> None:
        handle = self._fragments.pop(fid)
        if fid in self._managed:
            self._managed.discard(fid)
            self._retired[fid] = handle

    def pin(self, fids: set[str]) -> int:
        self._next_token += 1
        self._pins[self._next_token] = tuple(fids)
        for fid in fids:
            self._readers[fid] = self._readers.get(fid, 0) + 1
        return self._next_token

    def release_read(self, token: int) -> dict[str, Any]:
        """Ends a pinned read (again: no effect); fragments it alone kept alive retire."""
        for fid in self._pins.pop(token, ()):
            left = self._readers[fid] - 1
            if left:
                self._readers[fid] = left
                continue
            del self._readers[fid]
            if fid not in self._refcounts:
                self._retire(fid)
        return self.retired_result()

    def drain(self) -> dict[str, Any]:
        """Retires every managed fragment and forgets every other one; terminal. Refused while
        pinned reads are active."""
        if self._pins:
            raise RuntimeError(
                f"cannot drain DataProto catalog with {len(self._pins)} active read(s)"
            )
        for fid in self._managed:
            self._retired[fid] = self._fragments[fid]
        for table in (self._fragments, self._refcounts, self._readers):
            table.clear()
        self._managed.clear()
        self.drained = True
        return self.retired_result()

    def ack_retired(self, handles: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Forgets retired handles whose objects the caller removed."""
        for handle in handles:
            ref, canonical = U.normalize(handle)
            fid = next((f for f, h in self._retired.items() if h == canonical), None)
            if fid is not None:
                del self._retired[fid]
                continue
            if len(ref.stage_refs) == 1:
                key = next(iter(ref.stage_refs.values())).manifest_key
                if key in self._retired:
                    raise ValueError(f"retired DataProto fragment mismatch: {key!r}")
        return self.retired_result()


class Publications:
    """The first answer of each publishing operation (operation id -> a private copy), so a
    retry after a lost answer gets that answer and changes nothing; forgotten on
    ``ack_publication``. It grows until each operation is acknowledged (the transfer client
    acknowledges every one once it has the answer), as the wheel's catalog."""

    def __init__(self) -> None:
        self._answers: dict[str, dict[str, Any]] = {}

    def answer(self, op: str) -> dict[str, Any] | None:
        got = self._answers.get(op)
        return None if got is None else copy.deepcopy(got)

    def record(self, op: str, result: dict[str, Any]) -> dict[str, Any]:
        self._answers[op] = copy.deepcopy(result)
        return result

    def forget(self, op: str) -> None:
        self._answers.pop(op, None)

    def clear(self) -> None:
        self._answers.clear()
