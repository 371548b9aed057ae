"""``publish_append``: a managed fragment replaced by its appended handle (the same rows with more
fields), idempotent per operation id; a stale or inconsistent append is rejected with a message
(``append_rejected``) rather than an exception, so a retried call sees the same answer."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvcake.compat.mooncake._structured import _catalog_util as U
from kvcake.compat.mooncake._structured._catalog_state import CatalogState


class AppendMixin(CatalogState):
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
        if op in self._publications:
            return copy.deepcopy(self._publications[op])
        if self._drained:
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
        for row, key in enumerate(keys):
            for name in new_fields:
                old = entries[key].fields.get(name)
                if old is not None:
                    self._drop(old[0])
                entries[key].fields[name] = (fid, row)
                self._refcounts[fid] += 1
        self._fragments[fid] = canonical
        result = {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k].tag) for k in keys],
            "fields": U.field_union(entries, keys),
            **self._retired_result(),
        }
        self._publications[op] = copy.deepcopy(result)
        return result

    def _append_problem(
        self, fid: str, prev: Any, prev_ref: Any, ref: Any, partition: str, keys: Sequence[str]
    ) -> str | None:
        if self._fragments.get(fid) != prev or fid not in self._managed:
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
        result = {"append_rejected": message}
        self._publications[op] = copy.deepcopy(result)
        return result
