"""``DataProtoCatalogTransfer``: the client side of a catalog reached through ``catalog_call(method,
*args, **kwargs)`` (often an RPC). Stores a DataProto, then publishes it under an operation id so
a call whose answer was lost can be repeated safely; what could not be published or
acknowledged is kept and retried by the next call (``close`` and ``drain`` insist); retired
fragments are cleaned up from the store and acknowledged."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvcake.compat.mooncake._structured import _catalog_util as U
from kvcake.compat.mooncake._structured._handles import export_dataproto_ref

log = logging.getLogger(__name__)
Publication = dict[str, Any]


class DataProtoCatalogTransfer:
    _RESULTS_ATTR = "_mooncake_catalog_results"

    def __init__(self, transfer: Any, catalog_call: Callable[..., Any]) -> None:
        self.transfer = transfer
        self._catalog_call = catalog_call
        self._pending_publications: list[Publication] = []
        self._pending_publication_acks: list[str] = []
        self._pending_results: list[Any] = []
        self._cleanup_lock = threading.RLock()

    def put(
        self,
        data: Any,
        *,
        partition: str,
        keys: Sequence[str],
        tags: Sequence[Mapping[str, Any]] | None = None,
        **put_kwargs: Any,
    ) -> dict[str, Any]:
        """Stores one fragment and publishes it (with ``tags``) for ``keys``."""
        self._flush()
        partition = U.nonempty(partition, "partition")
        keys = U.names(keys, "keys")
        new_tags = U.tags(tags, len(keys))
        if data is None and new_tags is None:
            raise ValueError("catalog update requires tags or DataProto data")
        handle = None
        if data is not None:
            if len(data) != len(keys):
                raise ValueError(
                    f"DataProto batch size {len(data)} does not match {len(keys)} logical keys"
                )
            ref = self.transfer.put(data, type="dataproto", partition=partition, **put_kwargs)
            handle = export_dataproto_ref(ref)
        kwargs = {"tags": new_tags, "handle": handle}
        return self._publish_twice(_publication("publish", (partition, keys), kwargs))

    def append(
        self,
        fragment_id: str,
        handle: Mapping[str, Any],
        data: Any,
        *,
        partition: str,
        keys: Sequence[str],
        stage: str,
        **append_kwargs: Any,
    ) -> dict[str, Any]:
        """Appends fields to a managed fragment; the appended handle takes over its rows."""
        self._flush()
        fid = U.nonempty(fragment_id, "fragment_id")
        partition = U.nonempty(partition, "partition")
        keys = U.names(keys, "keys")
        if append_kwargs.get("overwrite"):
            raise ValueError("catalog append does not support overwrite")
        if len(data) != len(keys):
            raise ValueError(
                f"DataProto batch size {len(data)} does not match {len(keys)} logical keys"
            )
        prev_ref, prev = U.normalize(handle)
        if prev_ref.partition != partition:
            raise ValueError("DataProto handle partition does not match Catalog partition")
        plan = self._catalog_call("resolve", partition, keys, list(prev_ref.field_index))
        if plan["handles"].get(fid) != prev:
            raise ValueError(f"stale DataProto append handle: {fid!r}")
        new = self.transfer.append_dataproto_fields(prev, data, stage=stage, **append_kwargs)
        kwargs = {"previous_handle": prev, "handle": export_dataproto_ref(new)}
        result = self._publish_twice(_publication("publish_append", (fid, partition, keys), kwargs))
        if result.get("append_rejected") is not None:
            raise ValueError(result["append_rejected"])
        return result

    def resolve(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """A pinned read plan; ``release_read(plan["read_token"])`` when done with it."""
        return self._catalog_call("resolve", partition, keys, fields, pin=True)

    def release_read(self, token: int) -> None:
        self._cleanup_retired(self._catalog_call("release_read", token))

    def attach_results(self, output: Any, results: Sequence[Any]) -> None:
        setattr(output, self._RESULTS_ATTR, list(results))

    def release_result(self, output: Any) -> None:
        results = getattr(output, self._RESULTS_ATTR, ()) or ()
        setattr(output, self._RESULTS_ATTR, [])
        self.discard_results(results)

    def discard_results(self, results: Sequence[Any], *, strict: bool = False) -> None:
        self._retry(
            "_pending_results",
            results,
            self.transfer.release_result,
            "release DataProto read buffer",
            attempts=2,
            strict=strict,
        )

    def list(self, partition: str | None = None) -> dict[str, dict[str, Any]]:
        return self._catalog_call("list", partition)

    def remove(self, partition: str, keys: Sequence[str]) -> None:
        self._cleanup_retired(self._catalog_call("remove", partition, keys))

    def drain(self) -> None:
        for attempt in range(2):
            try:
                self._retry_publications(strict=True)
                self._cleanup_retired(self._catalog_call("drain"), strict=True)
                return
            except Exception:
                if attempt:
                    raise
                log.exception("Retrying DataProto Catalog drain")

    def close(self) -> None:
        self.discard_results((), strict=True)
        self._retry_publications(strict=True)
        self._retry_acks(strict=True)

    # --- publication and cleanup ----------------------------------------------------------

    def _flush(self) -> None:
        self._retry_acks()
        self._retry_publications(strict=True)

    def _publish_twice(self, publication: Publication) -> dict[str, Any]:
        try:
            return self._publish(publication)
        except Exception:
            log.exception("Retrying DataProto Catalog publication")
        try:
            return self._publish(publication)
        except Exception:
            with self._cleanup_lock:
                self._pending_publications.append(publication)
            raise

    def _publish(self, publication: Publication) -> dict[str, Any]:
        op, method = publication["operation_id"], publication["method"]
        result = self._catalog_call(method, op, *publication["args"], **publication["kwargs"])
        if method == "publish_append" and result.get("append_rejected"):
            kwargs = publication["kwargs"]
            self.transfer.cleanup_dataproto_append(kwargs["previous_handle"], kwargs["handle"])
        self._cleanup_retired(result)
        try:
            self._catalog_call("ack_publication", op)
        except Exception:
            log.exception("Failed to acknowledge DataProto Catalog publication")
            with self._cleanup_lock:
                if op not in self._pending_publication_acks:
                    self._pending_publication_acks.append(op)
        return result

    def _cleanup_retired(self, result: Mapping[str, Any], *, strict: bool = False) -> None:
        removed, failures = [], 0
        for handle in result.get("retired_handles", ()):
            try:
                self.transfer.cleanup_dataproto(handle)
            except Exception:
                failures += 1
                log.exception("Failed to clean up retired DataProto fragment")
            else:
                removed.append(handle)
        if removed:
            try:
                self._catalog_call("ack_retired", removed)
            except Exception:
                log.exception("Failed to acknowledge retired DataProto fragments")
                if strict:
                    raise
        if strict and failures:
            raise RuntimeError(f"failed to clean up {failures} retired DataProto fragment(s)")

    def _retry_acks(self, *, strict: bool = False) -> None:
        def ack(op: str) -> None:
            self._catalog_call("ack_publication", op)

        self._retry(
            "_pending_publication_acks",
            (),
            ack,
            "acknowledge DataProto Catalog publication",
            strict=strict,
        )

    def _retry_publications(self, *, strict: bool = False) -> None:
        self._retry(
            "_pending_publications",
            (),
            self._publish,
            "publish pending DataProto fragment",
            strict=strict,
        )

    def _retry(
        self,
        attr: str,
        items: Sequence[Any],
        action: Callable[[Any], Any],
        label: str,
        *,
        attempts: int = 1,
        strict: bool = False,
    ) -> None:
        """Runs ``action`` on the pending items of ``attr`` plus ``items``; the ones that still
        fail stay pending (``strict``: and a RuntimeError says how many)."""
        with self._cleanup_lock:
            pending = [*getattr(self, attr), *items]
            setattr(self, attr, [])
        for _ in range(attempts):
            failed = []
            for item in pending:
                try:
                    action(item)
                except Exception:
                    log.exception("Failed to %s", label)
                    failed.append(item)
            pending = failed
        with self._cleanup_lock:
            getattr(self, attr).extend(pending)
            left = len(getattr(self, attr))
        if strict and left:
            raise RuntimeError(f"failed to {label} for {left} item(s)")


def _publication(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Publication:
    return {"operation_id": uuid.uuid4().hex, "method": method, "args": args, "kwargs": kwargs}
