"""``publish_append``: a managed fragment replaced by its appended handle (the same rows with more
fields), idempotent per operation id; a stale or inconsistent append is rejected with a message
(``append_rejected``) rather than an exception, so a retried call sees the same answer."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvcake.compat.mooncake._structured import _catalog_util as U
from kvcake.compat.mooncake._structured._catalog_state import Lifetimes, Publications

Rows = dict[str, dict[str, Any]]  # partition -> key -> Entry (the catalog's rows)


class Appender:
    """``publish_append`` on the catalog's rows, fragment lifetimes and publications (all three
    owned by the catalog and shared with it; no lock: the catalog's host serializes calls)."""

    def __init__(self, rows: Rows, lifetimes: Lifetimes, publications: Publications) -> None:
        self._partitions = rows
        self._life = lifetimes
        self._publications = publications

    def publish_append(
        self,
        operation_id: str,
        fragment_id: str,
        partition: str,
        keys: Sequence[str],
        *,
        previous_handle: Mapping[str, Any],
        handle: Mapping[str, Any],
    ) -> dict[str, Any]:
        op = U.nonempty(operation_id, "operation_id")
        known = self._publications.answer(op)
        if known is not None:
            return known
        if self._life.drained:
            return self._reject(op, "DataProto catalog is drained")
        fid = U.nonempty(fragment_id, "fragment_id")
        partition = U.nonempty(partition, "partition")
        keys = U.names(keys, "keys")
        prev_ref, prev = U.normalize(previous_handle)
        ref, canonical = U.normalize(handle)
        problem = self._append_problem(fid, prev, prev_ref, ref, partition, keys)
        if problem:
            return self._reject(op, problem)
        entries = self._partitions[partition]
        new_fields = [f for f in ref.field_index if f not in prev_ref.field_index]
        self._point(entries, keys, new_fields, fid)
        self._life.replace(fid, canonical)
        result = {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k].tag) for k in keys],
            "fields": U.field_union(entries, keys),
            **self._life.retired_result(),
        }
        return self._publications.record(op, result)

    def _point(
        self, entries: dict[str, Any], keys: Sequence[str], names: list[str], fid: str
    ) -> None:
        """Each row's new fields point at the fragment's row (what they pointed at loses a ref)."""
        for row, key in enumerate(keys):
            for name in names:
                old = entries[key].fields.get(name)
                if old is not None:
                    self._life.drop(old[0])
                entries[key].fields[name] = (fid, row)
                self._life.ref(fid)

    def _append_problem(
        self, fid: str, prev: Any, prev_ref: Any, ref: Any, partition: str, keys: Sequence[str]
    ) -> str | None:
        if self._life.handle(fid) != prev or not self._life.is_managed(fid):
            return f"stale DataProto append handle: {fid!r}"
        same_rows = ref.batch_size == prev_ref.batch_size == len(keys)
        same_home = ref.partition == prev_ref.partition == partition
        if not (same_rows and same_home) or ref._storage_group_id != prev_ref._storage_group_id:
            return "appended DataProto handle changed fragment identity"
        if any(ref.field_index.get(n) != loc for n, loc in prev_ref.field_index.items()):
            return "appended DataProto handle changed existing fields"
        entries = self._partitions.get(partition, {})
        missing = [k for k in keys if k not in entries]
        if missing:
            return f"keys not found in partition {partition!r}: {missing}"
        return None

    def _reject(self, op: str, message: str) -> dict[str, Any]:
        return self._publications.record(op, {"append_rejected": message})
