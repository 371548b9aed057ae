"""The catalog's bookkeeping of fragment lifetimes: references from rows, pinned readers,
retirement of managed fragments and the acknowledgement of their cleanup, and the terminal
drain."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvcake.compat.mooncake._structured import _catalog_util as U


class CatalogState:
    def __init__(self) -> None:
        self._partitions: dict[str, dict[str, Any]] = {}  # partition -> key -> Entry
        self._fragments: dict[str, dict[str, Any]] = {}  # fragment id -> canonical handle
        self._refcounts: dict[str, int] = {}  # row fields pointing into a fragment
        self._managed: set[str] = set()
        self._readers: dict[str, int] = {}  # pinned reads using a fragment
        self._pins: dict[int, tuple[str, ...]] = {}
        self._next_token = 0
        self._retired: dict[str, dict[str, Any]] = {}  # awaiting ack_retired
        self._publications: dict[str, dict[str, Any]] = {}  # operation id -> first answer
        self._drained = False

    def _retired_result(self) -> dict[str, Any]:
        return {"retired_handles": [copy.deepcopy(h) for h in self._retired.values()]}

    def _drop(self, fid: str) -> None:
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

    def _pin(self, fids: set[str]) -> int:
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
        return self._retired_result()

    def drain(self) -> dict[str, Any]:
        """Retires every managed fragment and forgets everything; the catalog takes no more
        updates. Refused while pinned reads are active."""
        if self._pins:
            raise RuntimeError(
                f"cannot drain DataProto catalog with {len(self._pins)} active read(s)"
            )
        for fid in self._managed:
            self._retired[fid] = self._fragments[fid]
        for table in (
            self._partitions,
            self._fragments,
            self._refcounts,
            self._readers,
            self._publications,
        ):
            table.clear()
        self._managed.clear()
        self._drained = True
        return self._retired_result()

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
        return self._retired_result()
