"""kvcake's ``mooncake.dataproto_catalog``: a catalog mapping logical rows and fields to stored
DataProto fragments (``DataProtoCatalog``) and its client (``DataProtoCatalogTransfer``).
Status: docs/compat/mooncake.md."""

from __future__ import annotations

from kvcake.compat.mooncake._structured._catalog import DataProtoCatalog
from kvcake.compat.mooncake._structured._catalog_transfer import DataProtoCatalogTransfer

__kvcake__ = True
__all__ = ["DataProtoCatalog", "DataProtoCatalogTransfer"]
