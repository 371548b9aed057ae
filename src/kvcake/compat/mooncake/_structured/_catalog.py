"""``DataProtoCatalog``: logical rows (partition, key) with tags, and for each of their fields the
immutable DataProto fragment and row holding it. Fragments a ``DataProtoCatalogTransfer``
published are *managed*: once no row references one and no pinned read uses it, it is retired
and its handle is returned (``retired_handles``) until the caller acknowledges its cleanup.

One catalog's calls must be serialized by its host (it keeps no lock of its own)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcake.compat.mooncake._structured import _catalog_util as U
from kvcake.compat.mooncake._structured._catalog_append import Appender, Rows
from kvcake.compat.mooncake._structured._catalog_state import Lifetimes, Publications
from kvcake.core.via import Via


@dataclass
class Entry:
    tag: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, U.Location] = field(default_factory=dict)


class DataProtoCatalog:
    """Owns the rows (partition -> key -> Entry), the fragment lifetimes (``Lifetimes``) and the
    publications' first answers (``Publications``); ``publish_append`` is the ``Appender``'s
    (over the same three), ``release_read`` and ``ack_retired`` the lifetimes' (``Via``).
    Answers are deep copies: the caller owns them. No lock: the host serializes one catalog's
    calls (the wheel's catalog is an actor)."""

    def __init__(self) -> None:
        self._partitions: Rows = {}
        self._life = Lifetimes()
        self._publications = Publications()
        self._appender = Appender(self._partitions, self._life, self._publications)

    publish_append = Via("_appender", Appender.publish_append)
    release_read = Via("_life", Lifetimes.release_read)
    ack_retired = Via("_life", Lifetimes.ack_retired)

    def update(
        self,
        partition: str,
        keys: Sequence[str],
        *,
        tags: Sequence[Mapping[str, Any]] | None = None,
        handle: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Merges tags into rows and points the handle's fields at its rows (unmanaged)."""
        return self._update(partition, keys, tags, handle, managed=False)

    def publish(
        self,
        operation_id: str,
        partition: str,
        keys: Sequence[str],
        *,
        tags: Sequence[Mapping[str, Any]] | None = None,
        handle: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``update`` of a managed fragment, idempotent per ``operation_id`` until acknowledged
        (a retry after a lost answer gets the first answer and changes nothing)."""
        op = U.nonempty(operation_id, "operation_id")
        known = self._publications.answer(op)
        if known is not None:
            return known
        result = self._update(partition, keys, tags, handle, managed=handle is not None)
        return self._publications.record(op, result)

    def ack_publication(self, operation_id: str) -> None:
        self._publications.forget(U.nonempty(operation_id, "operation_id"))

    def drain(self) -> dict[str, Any]:
        """Retires every managed fragment and forgets everything; the catalog takes no more
        updates. Refused while pinned reads are active."""
        result = self._life.drain()
        self._partitions.clear()
        self._publications.clear()
        return result

    def _update(
        self,
        partition: str,
        keys: Sequence[str],
        tags: Sequence[Mapping[str, Any]] | None,
        handle: Mapping[str, Any] | None,
        managed: bool,
    ) -> dict[str, Any]:
        if self._life.drained:
            raise RuntimeError("DataProto catalog is drained")
        partition = U.nonempty(partition, "partition")
        keys = U.names(keys, "keys")
        new_tags = U.tags(tags, len(keys))
        frag = U.fragment(handle, len(keys)) if handle is not None else None
        if new_tags is None and frag is None:
            raise ValueError("catalog update requires tags or a DataProto handle")
        if frag is not None:
            self._check_fragment(frag[0], frag[1], managed)
        entries = self._partitions.setdefault(partition, {})
        for row, key in enumerate(keys):
            entry = entries.setdefault(key, Entry())
            if new_tags is not None:
                entry.tag.update(new_tags[row])
        if frag is not None:
            self._place(entries, keys, frag, managed)
        return self._answer(entries, keys)

    def _check_fragment(self, fid: str, canonical: dict[str, Any], managed: bool) -> None:
        known = self._life.handle(fid)
        if known is not None and known != canonical:
            raise ValueError(f"DataProto fragment id collision: {fid!r}")
        if known is not None and self._life.is_managed(fid) != managed:
            raise ValueError(f"DataProto fragment management mismatch: {fid!r}")
        if self._life.is_retiring(fid):
            raise ValueError(f"DataProto fragment id is pending retirement: {fid!r}")

    def _place(
        self, entries: dict[str, Any], keys: Sequence[str], frag: Any, managed: bool
    ) -> None:
        fid, canonical, fields = frag
        self._life.register(fid, canonical, managed)
        for row, key in enumerate(keys):
            for name in fields:
                self._point(entries[key], name, (fid, row))

    def _point(self, entry: Entry, name: str, loc: U.Location) -> None:
        old = entry.fields.get(name)
        entry.fields[name] = loc
        if old is not None and old[0] == loc[0]:
            return  # same fragment: its reference count does not change
        if old is not None:
            self._life.drop(old[0])
        self._life.ref(loc[0])

    def _answer(self, entries: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
        return {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k].tag) for k in keys],
            "fields": U.field_union(entries, keys),
            **self._life.retired_result(),
        }

    def resolve(
        self,
        partition: str,
        keys: Sequence[str],
        fields: Sequence[str] | None = None,
        *,
        pin: bool = False,
    ) -> dict[str, Any]:
        """The fragments and rows to read ``fields`` of ``keys`` from, fields grouped by equal
        locations; ``pin`` keeps those fragments alive until ``release_read(read_token)``."""
        partition = U.nonempty(partition, "partition")
        keys = U.names(keys, "keys")
        entries = self._partitions.get(partition, {})
        missing = [k for k in keys if k not in entries]
        if missing:
            raise ValueError(f"keys were not found in partition {partition!r}: {missing}")
        chosen = (
            list(U.names(fields, "field names"))
            if fields is not None
            else U.field_union(entries, keys)
        )
        if not chosen:
            raise ValueError("requested keys do not contain any fields")
        _check_ready(entries, keys, chosen)
        groups: dict[tuple[U.Location, ...], list[str]] = {}
        for name in chosen:
            groups.setdefault(tuple(entries[k].fields[name] for k in keys), []).append(name)
        used = {loc[0] for locs in groups for loc in locs}
        handles = self._life.handles(used)
        result: dict[str, Any] = {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k].tag) for k in keys],
            "fields": chosen,
            "field_groups": [{"fields": f, "locations": list(locs)} for locs, f in groups.items()],
            "handles": handles,
            "meta_info": _merged_meta(handles.values()),
        }
        if pin:
            result["read_token"] = self._life.pin(used)
        return result

    def list(self, partition: str | None = None) -> dict[str, dict[str, Any]]:
        if partition is not None:
            partition = U.nonempty(partition, "partition")
            chosen = [partition] if partition in self._partitions else []
        else:
            chosen = list(self._partitions)
        return {
            p: {k: copy.deepcopy(e.tag) for k, e in self._partitions[p].items()} for p in chosen
        }

    def remove(self, partition: str, keys: Sequence[str]) -> dict[str, Any]:
        """Forgets rows; fragments no longer referenced retire (see ``retired_handles``)."""
        partition = U.nonempty(partition, "partition")
        keys = U.names(keys, "keys")
        entries = self._partitions.get(partition)
        if entries is None:
            return self._life.retired_result()
        for key in keys:
            entry = entries.pop(key, None)
            if entry is None:
                continue
            for fid, _row in entry.fields.values():
                self._life.drop(fid)
        if not entries:
            del self._partitions[partition]
        return self._life.retired_result()


def _check_ready(entries: dict[str, Entry], keys: Sequence[str], chosen: Sequence[str]) -> None:
    for key in keys:
        absent = [f for f in chosen if f not in entries[key].fields]
        if absent:
            raise ValueError(f"fields are not ready for key {key!r}: {absent}")


def _merged_meta(handles: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for handle in handles:
        for name, value in handle.get("meta_info", {}).items():
            if name in out and out[name] != value:
                raise ValueError(f"conflicting DataProto meta_info value for {name!r}")
            out[name] = copy.deepcopy(value)
    return out
